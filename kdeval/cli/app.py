"""The `kdeval` command: one Typer app; each command group lives in its own module, imported only when one
of its commands runs, so ``kdeval --help`` imports neither torch, matplotlib nor Ray (``bench/cli_startup.py``
times it).

:data:`COMMANDS` names each command's module and the one line ``kdeval --help`` shows for it (the first
paragraph of the command's own docstring; a test keeps the two equal). A new command goes into it.
"""
from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

#: command -> (module under kdeval.cli that registers it, its one-line help), in the order `--help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("generate_cmds", "Run one prompt through the chunked engine and print the answer and the run's stats."),
    "policies": ("generate_cmds", "List every registered eviction policy with its rule, parameters and extra cost."),
    "check-policy": ("check_cmds", "Run the engine's invariant matrix on one policy (built-in or plugin) on "
                                   "tiny random models."),
    "models": ("models_cmds", "List every decoder family the engine is tested on, with its layer kinds and status."),
    "tasks": ("evals_cmds", "List every task with its benchmark, metric and data source."),
    "score": ("evals_cmds", "Score stored predictions with the task's metric; print per-sample scores and the aggregate."),
    "submit": ("service_cmds", "Validate a grid, record a run and execute its cells (cells already done are reused)."),
    "status": ("service_cmds", "Per-run and per-state counts; a run's cells with worker/node and failures with their error."),
    "ls": ("service_cmds", "List runs, newest first."),
    "cancel": ("service_cmds", "Cancel a run: its driver stops dispatching at its next heartbeat and kills its workers."),
    "resume": ("service_cmds", "Finish a run: retry failed and lost cells, never recompute done ones."),
    "rescore": ("service_cmds", "Recompute every stored prediction's score with the current metric code."),
    "report": ("report_cmds", "Scores per model × task × policy × budget × chunk with paired deltas and 95% bootstrap CIs."),
    "leaderboard": ("leaderboard_cmds", "Every done cell of the index, one row per cell id, ranked, with Δ vs the full cache "
                                        "paired across runs."),
    "nightly": ("nightly_cmds", "Run (or resume) the grid, compare it with the last passing nightly, exit 1 on a regression."),
    "index": ("index_cmds", "Rebuild the index from a results directory: runs, cells and summaries (not attempt "
                            "history)."),
    "export": ("export_cmds", "One table of every sample of a run's done cells: identity columns (run_id, cell_id, model, "
                              "policy, params, budget, chunk_size, task, length, seed, dtype, protocol) and every row "
                              "column."),
    "import": ("import_cmds", "Import another tool's results (kvpress) as an external run that reports compare."),
}


class LazyGroup(TyperGroup):
    """A Typer group that imports a command's module when the command runs (or its own help is asked for);
    listing the commands uses :data:`COMMANDS` alone."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in COMMANDS:
            return None
        short = COMMANDS[cmd_name][1]
        return TyperCommand(cmd_name, help=short, short_help=short)  # a listing entry; never invoked

    def invoke(self, ctx: Any) -> Any:
        """Run the command; an index that fails in use (its disk full, its file corrupt or locked, its server
        gone: ``IndexStorageError``, raised by any command that reads it) is one line on stderr and exit 1."""
        try:
            return super().invoke(ctx)
        except RuntimeError as e:
            from kdeval.storage import IndexStorageError  # only once a command failed: --help stays light

            if not isinstance(e, IndexStorageError):
                raise
            from kdeval.cli.consoles import stderr
            from kdeval.cli.errors import EXIT_FAILED

            stderr(markup=False).print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_FAILED) from None

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] in COMMANDS:
            load(self, args[0])
        elif args:  # an unknown name: "did you mean" looks among every command, loaded or not
            for name in COMMANDS:
                self.commands.setdefault(name, self.get_command(ctx, name))
        return super().resolve_command(ctx, args)


def load(group: TyperGroup, name: str) -> Any:
    """Import the module of command ``name`` and add every command it registers to ``group``; returns it."""
    module = importlib.import_module(f"kdeval.cli.{COMMANDS[name][0]}")
    sub = typer.Typer()
    module.register(sub)
    for cmd_name, cmd in typer.main.get_group(sub).commands.items():
        group.commands.setdefault(cmd_name, cmd)
    return group.commands[name]


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True)


@app.callback()
def _main() -> None:
    """Evaluate KV-cache eviction policies under a hard memory budget."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
