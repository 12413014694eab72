"""The `kdeval` command: one Typer app; each command group lives in its own module."""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Evaluate KV-cache eviction policies under a hard memory budget.")

# Each module defines register(app). Modules of layers not yet installed are skipped.
_COMMAND_MODULES = ("generate_cmds", "evals_cmds", "service_cmds", "report_cmds", "export_cmds")

for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"kdeval.cli.{_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"kdeval.cli.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
