"""Shared helpers of the run, storage, cluster and CLI tests: stub grids, submitting one, inspecting the index and
the Parquet files, waiting."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pyarrow.parquet as pq

from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.storage import RunIndex, list_result_files, list_temp_files, part_files


STUB_GRID = """
name: stub-grid
models: ["stub:{cost}"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 3}}]
resources: {{workers: {workers}}}
retries: {{max_attempts: 3}}
"""


def stub_grid(cost: float = 0.02, workers: int = 2) -> str:
    """A 5-cell grid (full shared across 2 budgets + 2 policies x 2 budgets) of stub cells."""
    return STUB_GRID.format(cost=cost, workers=workers)


def new_run(db: Path, results: Path, text: str) -> tuple[RunIndex, str, service.RunPlan]:
    """Open the index, validate ``text`` and record a run."""
    idx = RunIndex.open(db)
    grid = parse_grid(text)
    run_id, plan = service.create_run(idx, grid, text, results)
    return idx, run_id, plan


#: Columns that say how a row was computed, not what: timings, the process's memory, the batch it was timed in,
#: which execution computed it, the K/V buffers allocated for its batch, the run that stored it.
HOW_COMPUTED = frozenset({"ttft_s", "decode_s", "decode_tokens_per_s", "peak_memory_bytes", "timing_batch",
                          "shared_prefill_s", "execution", "replayed_steps", "run_id", "kv_buffer_bytes"})


def cell_rows(idx: RunIndex, cell_id: str, drop: frozenset[str] | set[str] = HOW_COMPUTED) -> list[dict]:
    """A stored cell's rows, less the columns ``drop``."""
    return [{k: v for k, v in r.items() if k not in drop} for r in idx.read_cell_table(cell_id).to_pylist()]


def result_file(results: Path, view) -> Path:
    """The one Parquet file holding a one-shard cell's rows: its only part (or an older one-file result)."""
    path = Path(results) / view.result_path
    if path.is_dir():
        [part] = part_files(path)
        return part
    return path


def assert_results_consistent(idx: RunIndex, run_id: str, results: Path, samples: int) -> None:
    """Every done cell has exactly one Parquet file with ``samples`` distinct rows; no temp files."""
    done = idx.run_cells(run_id, states=["done"])
    files = list_result_files(results)
    assert len(files) == len(done)
    assert list_temp_files(results) == []
    for cell in done:
        table = pq.read_table(Path(cell.results_dir) / cell.result_path)
        assert table.num_rows == samples == cell.n_rows
        assert len(set(table.column("id").to_pylist())) == samples  # no duplicate rows
        done_attempts = [a for a in idx.cell_attempts(cell.id) if a.state == "done"]
        assert len(done_attempts) == 1  # done exactly once


def attempt_states(idx: RunIndex, run_id: str) -> Counter:
    """How many attempts of the run ended in each state."""
    return Counter(a.state for a in idx.run_attempts(run_id))


def wait_until(pred: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> None:
    """Poll ``pred`` every ``every`` seconds until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop_background(pid: int) -> None:
    """End a background driver the test started (if it is still alive) and reap it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def cli_app(register):
    """A Typer app holding the commands ``register`` adds, plus a no-op one so that each stays a named
    subcommand (as in ``kdeval``)."""
    import typer

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    return app


@contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``1m``, ``64k``) mounted on the empty directory ``mnt`` while the block runs
    (unmounted at the end, whatever happens); the test is skipped where it cannot be mounted."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
