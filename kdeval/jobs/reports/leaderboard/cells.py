"""What a leaderboard reads: every done cell of the index, once per cell id, whatever run holds it.

A cell id is one computation (:mod:`kdeval.jobs.grid.cells`), so the same cell listed by three runs (a grid run
again, a nightly, an import) is gathered once, with the runs that hold it. The filters pick the cells shown;
the full-cache cells they are compared with are gathered whatever the policy and protocol filters say.
Bad filters are bad input (:class:`LeaderboardInputError`: an unknown model, task, policy or protocol with a
"did you mean", an index without runs, a named run still in progress); filters that match nothing are not.

    gathered = gather(index, Filters(models=("smollm2-135m",), tasks=("ruler",)))
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kdeval.jobs.grid.cells import store_label
from kdeval.jobs.reports.report_rows import FULL
from kdeval.jobs.reports.samples import LoadedCell, benchmark_of, load_cell, slot_of, task_name
from kdeval.jobs.run.drivers import driver_alive
from kdeval.names import suggest
from kdeval.storage import CellState, CellView, RunIndex, RunView

#: How ``--protocol`` may name the compression side of a protocol (the result rows' ``prompt/evict`` form too).
PROTOCOL_WORDS = {"prompt": "prompt", "query-aware": "prompt", "context": "context",
                  "query-agnostic": "context", "generated": "generated", "prompt-kept": "generated"}
PROTOCOL_LABELS = ("prompt/evict", "prompt/keep", "context/evict", "context/keep", "generated/evict")


class LeaderboardInputError(ValueError):
    """A filter or index a leaderboard cannot be built from (the CLI prints it in one line, exit 2)."""


@dataclass(frozen=True)
class Filters:
    """Which cells a leaderboard shows (empty: all). ``tasks`` match a task name (``ruler.niah_single_1``), its
    benchmark (``ruler``) or a task instance (``ruler.niah_single_1@2048#s0``); ``policies`` a policy name or
    label; ``protocols`` a protocol label (``context/keep``) or its compression side (``query-agnostic``);
    ``runs`` restrict the cells to those listed by these runs (ids or unique prefixes)."""

    models: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()


def protocol_label(view: CellView) -> str:
    """The cell's protocol as its rows name it: ``prompt/evict`` (the default), ``context/keep`` ..."""
    p = (view.spec or {}).get("protocol") or {}
    return f"{p.get('compress', 'prompt')}/{p.get('decode', 'evict')}"


def kv_quant_label(view: CellView) -> str:
    """The cell's KV store (``kivi-4b-g32-w128``), "" at the model's own width."""
    return store_label(view.spec)


def is_reference(cell: LoadedCell) -> bool:
    """A full-cache cell at the default protocol and the model's width: what every cell of its model, task
    instance and chunk size is compared with."""
    return cell.slot.policy == FULL


@dataclass
class Gathered:
    """The done cells to rank (one per cell id), the reference cells by (model, chunk, task instance), the runs
    holding each cell id (newest first), every run read, and notes for the reader."""

    cells: list[LoadedCell]
    references: dict[tuple[str, int, str], list[LoadedCell]]
    runs_of: dict[str, list[str]]
    runs: list[RunView]
    notes: list[str] = field(default_factory=list)


def _in_progress(run: RunView) -> bool:
    """Whether a run's driver is still computing its cells (a dead driver's run is not in progress)."""
    return driver_alive(run)


def _chosen_runs(index: RunIndex, refs: tuple[str, ...]) -> list[RunView]:
    runs = index.list_runs()
    if not runs:
        raise LeaderboardInputError("the index has no runs; `kdeval submit grid.yaml` first")
    if not refs:
        return runs
    chosen = []
    for ref in refs:
        run_id = index.resolve_run_id(ref)
        if run_id is None:
            raise LeaderboardInputError(f"--run {ref}: no such run (or the prefix is ambiguous); see `kdeval ls`")
        view = next(r for r in runs if r.id == run_id)
        if _in_progress(view):
            done = view.counts.get(CellState.DONE.value, 0)
            raise LeaderboardInputError(f"--run {ref}: run {run_id} is still in progress ({done} of {view.n_cells} "
                                        f"cells done); wait for it (`kdeval status {run_id}`) or leave --run out")
        chosen.append(view)
    return chosen


def _check_names(flag: str, wanted: tuple[str, ...], known: set[str], registered: set[str] | None = None,
                 words: str = "") -> None:
    """Exit-2 errors for filter values neither in the index (``known``) nor registered (``registered``)."""
    for name in wanted:
        if name in known or (registered is not None and name in registered):
            continue
        choices = known | (registered or set())
        listing = f"; the index has {', '.join(sorted(known))}" if known and len(known) <= 12 else ""
        raise LeaderboardInputError(f"{flag} {name}: unknown {words or flag.lstrip('-')}{suggest(name, choices)}"
                                    f"{listing}")


def _task_words(view: CellView) -> set[str]:
    name = task_name(view)
    return {name, view.task, benchmark_of(name)}


def _policy_words(view: CellView) -> set[str]:
    """What ``--policy`` may name a cell by: its policy's name and its label (``snapkv(window=32)``)."""
    return {view.policy, slot_of(view).policy}


def _protocol_ok(view: CellView, wanted: tuple[str, ...]) -> bool:
    label = protocol_label(view)
    return any(w == label or PROTOCOL_WORDS.get(w) == label.split("/")[0] for w in wanted)


def check_filters(filters: Filters, views: list[CellView]) -> None:
    """Raise :class:`LeaderboardInputError` for a filter value the index and the registries do not know."""
    from kdeval.evals import REGISTRY

    _check_names("--model", filters.models, {v.model for v in views}, words="model")
    registered_tasks = set(REGISTRY) | {spec.benchmark for spec in REGISTRY.values()}
    _check_names("--task", filters.tasks, set().union(*(_task_words(v) for v in views)), registered_tasks, "task")
    index_policies = {v.policy for v in views}
    unknown = [p for p in filters.policies if p not in index_policies and "(" not in p and "[" not in p]
    if unknown:
        from kdeval.cluster import catalog  # the policy registry (imports the engine): only when needed

        _check_names("--policy", tuple(unknown), index_policies, set(catalog.policy_names()), "policy")
    for p in filters.protocols:
        if p not in PROTOCOL_WORDS and p not in PROTOCOL_LABELS:
            raise LeaderboardInputError(f"--protocol {p}: unknown protocol{suggest(p, [*PROTOCOL_WORDS, *PROTOCOL_LABELS])}"
                                        f"; expected one of {', '.join([*PROTOCOL_WORDS, *PROTOCOL_LABELS])}")


def gather(index: RunIndex, filters: Filters = Filters(), results_dir: str | Path | None = None) -> Gathered:
    """The done cells of the runs (every run unless ``filters.runs``) that pass ``filters``, each read once,
    and the full-cache cells of their models, task instances and chunk sizes from every run.

    Raises :class:`LeaderboardInputError` for bad input (see the module's docstring)."""
    runs = _chosen_runs(index, filters.runs)
    every = index.list_runs()
    views: dict[str, CellView] = {}
    runs_of: dict[str, list[str]] = defaultdict(list)
    for run in every:  # newest first: a cell's first run is the newest that holds it
        for view in index.run_cells(run.id, states=[CellState.DONE.value]):
            views.setdefault(view.id, view)
            runs_of[view.id].append(run.id)
    check_filters(filters, list(views.values()))
    chosen = {r.id for r in runs}
    notes = [f"run {r.id} is still in progress: its {r.counts.get(CellState.DONE.value, 0)} done cell(s) are "
             f"included, the others are not" for r in every if r.id in chosen and _in_progress(r)]

    def shown_view(view: CellView) -> bool:
        return ((not filters.models or view.model in filters.models)
                and (not filters.tasks or bool(_task_words(view) & set(filters.tasks)))
                and (not filters.protocols or _protocol_ok(view, filters.protocols))
                and any(r in chosen for r in runs_of[view.id]))

    cells, references = [], defaultdict(list)
    for view in views.values():
        candidate = (not filters.models or view.model in filters.models) and (
            not filters.tasks or bool(_task_words(view) & set(filters.tasks)))
        if not candidate:
            continue
        cell = None
        if shown_view(view) and (not filters.policies or _policy_words(view) & set(filters.policies)):
            cell = load_cell(view, runs_of[view.id][0], results_dir)
            cells.append(cell)
        if view.policy == FULL:
            cell = cell or load_cell(view, runs_of[view.id][0], results_dir)
            if is_reference(cell):
                references[(cell.slot.model, cell.slot.chunk, cell.slot.task)].append(cell)
    unreadable = [c for c in cells if not c.done]
    notes += [f"cell {c.view.id[:8]} ({c.slot.policy} {c.slot.task}) is left out: {c.error}" for c in unreadable]
    return Gathered([c for c in cells if c.done], dict(references), dict(runs_of), every, notes)
