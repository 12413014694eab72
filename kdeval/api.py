"""kdeval from Python (a notebook, a script): run a grid and get its per-sample results as a DataFrame.

Example (what README's "Python API" section shows; ``tests/test_api.py`` runs it)::

    from kdeval.api import load_results, run_grid

    grid = {
        "name": "notebook",
        "models": ["random:llama-tiny"],          # or smollm2-135m, a hub id, a local path
        "policies": ["full", "keydiff", "sink"],
        "budgets": [128],
        "chunk_sizes": [64],
        "tasks": [{"name": "needle", "lengths": [512], "samples": 2, "params": {"haystack": "noise"}}],
        "generation": {"max_new_tokens": 4},
    }
    df = run_grid(grid)                           # or run_grid("examples/smoke.yaml")
    print(df.groupby(["policy", "budget"], dropna=False)["score"].mean())
    again = load_results(".kdeval/index.sqlite")  # the newest run's rows; nothing recomputed

:func:`run_grid` is ``kdeval submit`` without the terminal: the same validation, the same cells and cell ids,
the same index (``db``) and results directory, run through the same service functions
(:func:`kdeval.jobs.run.service.create_run`, :func:`kdeval.jobs.run.service.execute_run`) on a local Ray (or
``address``). Cells already done there — by the CLI or an earlier call — are reused, not recomputed.
Each row is one sample of one cell: its identity columns (``run_id``, ``cell_id``, ``model``, ``policy``,
``params``, ``budget`` (N; None for ``full`` and for a share of the prompt), ``budget_share`` (0.25 for a
``"25%"`` budget, else None), ``chunk_size``, ``task``, ``length``, ``seed``, ``dtype``, ``protocol``), then
the prediction, references, ``score`` (0-1; reports print 100 × the mean as points),
``resolved_budget`` (the N the sample kept: a share's resolved per prompt), latencies (``ttft_s``,
``decode_s``) and memory (``peak_kv_bytes``, ``peak_memory_bytes`` with its
``memory_kind``). ``df.attrs`` holds ``run_id``, ``cells``, ``reused`` (done before this call) and
``failed`` (cell id -> error line).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from kdeval.jobs.grid.schema import GridSpec
    from kdeval.jobs.run.progress import RunProgress
    from kdeval.storage import RunIndex

__all__ = ["run_grid", "load_results", "read_grid"]


def read_grid(grid_or_path: "GridSpec | Mapping[str, Any] | str | os.PathLike") -> tuple["GridSpec", str]:
    """The validated grid and the YAML text a run records, from what :func:`run_grid` takes (a grid file's path,
    YAML text, a mapping or a ``GridSpec``). Raises GridError (a ValueError) naming the field, as ``kdeval submit``
    does."""
    import yaml

    from kdeval.jobs.grid.schema import GridSpec
    from kdeval.jobs.grid.load import load_grid, parse_grid, validate_mapping

    if isinstance(grid_or_path, GridSpec):
        text = yaml.safe_dump(grid_or_path.model_dump(mode="json"), sort_keys=False)
        return parse_grid(text, "grid"), text
    if isinstance(grid_or_path, Mapping):
        raw = dict(grid_or_path)
        return validate_mapping(raw, "grid"), yaml.safe_dump(raw, sort_keys=False)
    if isinstance(grid_or_path, (str, os.PathLike)):
        if isinstance(grid_or_path, str) and "\n" in grid_or_path:  # YAML text, not a path
            return parse_grid(grid_or_path, "grid"), grid_or_path
        return load_grid(grid_or_path)
    raise TypeError(f"grid_or_path: expected a grid file path, YAML text, a mapping or a GridSpec, "
                    f"got {type(grid_or_path).__name__}")


def _frame(index: "RunIndex", run_id: str, results_dir: str | Path | None = None) -> "pd.DataFrame":
    """Every sample row of run ``run_id``'s done cells, with the cells left out (failed, pending, unusable
    files) warned about once and listed in ``attrs``."""
    import pandas as pd
    import pyarrow as pa

    from kdeval.jobs.interop.export import run_table

    export = run_table(index, run_id, results_dir)
    # Nullable integers: `budget` stays 128 (and <NA> for full) instead of becoming 128.0 beside a NaN.
    df = export.table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int64Dtype()}.get)
    failed = {c.id: c.error_line or c.state for c in index.run_cells(export.run_id) if c.state != "done"}
    failed.update({cid: f"result file not usable: {why}" for cid, why in export.skipped.items()})
    df.attrs.update(run_id=export.run_id, cells=export.cells + export.not_done + len(export.skipped), failed=failed)
    if failed:
        first = "; ".join(f"{cid[:10]}: {why}" for cid, why in list(failed.items())[:3])
        warnings.warn(f"run {export.run_id}: {len(failed)} cell(s) have no rows in the frame ({first}"
                      f"{' ...' if len(failed) > 3 else ''}); `kdeval status {export.run_id}` lists them and "
                      f"`kdeval resume {export.run_id}` retries them", RuntimeWarning, stacklevel=3)
    return df


def run_grid(
    grid_or_path: "GridSpec | Mapping[str, Any] | str | os.PathLike",
    *,
    db: str | os.PathLike | None = None,
    results_dir: str | os.PathLike | None = None,
    address: str | None = None,
    on_progress: "Callable[[RunProgress], None] | None" = None,
    plugins: "Sequence[str | os.PathLike] | None" = None,
) -> "pd.DataFrame":
    """Run a grid as ``kdeval submit`` does and return one row per sample of its cells.

    Args:
        grid_or_path: a grid file path, grid YAML text, a mapping with the grid's fields, or a ``GridSpec``.
        db: the index (a path or SQLAlchemy URL; default ``.kdeval/index.sqlite``, as the CLI).
        results_dir: where per-cell Parquet files go (default ``.kdeval/results``).
        address: a Ray cluster (``auto``, ``ray://host:10001``); default a local Ray started once per process.
        on_progress: called with a :class:`~kdeval.jobs.run.progress.RunProgress` as cells finish.
        plugins: Python files or importable module names whose policies the grid may name, as ``--plugin``
            (with the installed ``kdeval.policies`` entry points); a plugin edited since an earlier call is
            loaded again and its cells computed anew. A policy class defined in the calling script can also be
            registered directly (``kdeval.keydiff.policy.registry.register``): its cells hash its class's source;
            it runs on a local Ray only when its module is importable by the workers (a plugin file always is).

    Returns:
        a pandas DataFrame of every sample of the run's done cells (columns: see the module docstring);
        ``attrs``: ``run_id``, ``cells``, ``reused`` and ``failed``. Failed cells are warned about
        (``RuntimeWarning``), not raised: the rows of the others are returned.

    Raises:
        GridError (a ValueError): the grid is invalid or names data that is missing; nothing is written.
        PluginError (a ValueError): a plugin cannot be used (one line naming it); nothing is written.
        ConnectionError: Ray cannot be started, or the cluster at ``address`` not joined within 30 s (one line
            naming the address and the cause; the run is marked failed).
    """
    from kdeval.cluster.plugins import load_plugins
    from kdeval.jobs.run import service
    from kdeval.storage import RunIndex

    load_plugins([str(p) for p in plugins or ()])  # before the grid: it may name their policies
    grid, text = read_grid(grid_or_path)
    index = RunIndex.open(None if db is None else str(db))
    try:
        run_id, plan = service.create_run(index, grid, text, results_dir or service.DEFAULT_RESULTS_DIR)
        service.execute_run(index, run_id, address=address, on_progress=on_progress)  # no Ray when all reused
        df = _frame(index, run_id)
        df.attrs["reused"] = len(plan.done)
        return df
    finally:
        index.close()


def load_results(db: str | os.PathLike | None = None, run: str | None = None, *,
                 results_dir: str | os.PathLike | None = None) -> "pd.DataFrame":
    """The per-sample rows of a run already in the index (``run``: an id or unique prefix; default the
    newest run), as :func:`run_grid` returns them; nothing is run. ``results_dir``: where the Parquet files
    are, when moved since the run. Raises ValueError naming ``run`` (or the index) when there is none."""
    from kdeval.storage import RunIndex, db_url, sqlite_path

    path = sqlite_path(db_url(None if db is None else str(db), make_dirs=False))
    if path is not None and not path.is_file():
        raise ValueError(f"db: no index at {path} (nothing submitted yet?)")
    index = RunIndex.open(None if db is None else str(db), write=False)  # reads only: a read-only index works
    try:
        if run is None:
            runs = index.list_runs()
            if not runs:
                raise ValueError(f"db: the index {path or db} has no runs; run_grid(...) or `kdeval submit` first")
            run = runs[0].id
        elif index.get_run(run) is None:
            raise ValueError(f"run: no run {run!r} (or the prefix is ambiguous); see `kdeval ls`")
        return _frame(index, run, results_dir)
    finally:
        index.close()
