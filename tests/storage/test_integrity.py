"""Result integrity: a done cell counts only when its Parquet file is readable, all its own and complete.

A truncated file, one cut to fewer rows, another cell's file and a file written before rows named their
cell are recomputed on resubmit / resume / the scheduler's done-elsewhere check, and only those.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.identity import self_describing
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.jobs.run.run_config import SchedulerConfig
from kdeval.jobs.run.scheduler import Scheduler
from kdeval.storage import RunIndex, verify_cell, verify_cell_file, write_cell_rows

from tests.support.helpers import stub_grid
from tests.support.helpers import assert_results_consistent, new_run, result_file


def _rows(n: int) -> list[dict]:
    return [{"id": f"s{i}", "score": float(i % 2), "references": ["a"]} for i in range(n)]


def _cell_table(cell, run_id: str = "r0", n: int = 4):
    return self_describing(_rows(n), cell, run_id)


def _cut_bytes(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _keep_rows(path: Path, n: int) -> None:
    pq.write_table(pq.read_table(path).slice(0, n), path)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_verify_cell_file_names_each_problem(paths):
    cells = expand(parse_grid(stub_grid()))
    a, b = cells[0], cells[1]
    res = paths["results"]
    rel = write_cell_rows(res, a.id, _cell_table(a))
    assert verify_cell_file(res, rel, a.id, 4) is None
    assert verify_cell_file(res, rel, a.id, 8) == "4 rows, index says 8"
    assert verify_cell_file(res, "cells/zz/none.parquet", a.id, 4) == f"missing file {res / 'cells/zz/none.parquet'}"

    _keep_rows(res / rel, 3)
    assert verify_cell_file(res, rel, a.id, 4) == "3 rows, index says 4"

    shutil.copyfile(res / write_cell_rows(res, b.id, _cell_table(b)), res / rel)  # b's file in a's place
    assert verify_cell_file(res, rel, a.id, 4) == f"holds cell {b.id}"

    write_cell_rows(res, a.id, _rows(4))  # as written before rows carried their cell's id
    assert verify_cell_file(res, rel, a.id, 4) == "no cell_id column (written before rows named their cell)"

    write_cell_rows(res, a.id, _cell_table(a))
    _cut_bytes(res / rel)
    assert verify_cell_file(res, rel, a.id, 4).startswith("unreadable parquet: ")

    (res / rel).write_bytes(b"")
    assert verify_cell_file(res, rel, a.id, 4).startswith("unreadable parquet: ")


def test_damaged_results_are_recomputed_exactly_on_resubmit_and_resume(local_ray, paths):
    res = paths["results"]
    # one worker: each cell's 3 samples in one shard (two would split the group over them:
    # tests/jobs/run/test_spread.py)
    idx, run1, _ = new_run(paths["db"], res, stub_grid(workers=1))
    assert service.execute_run(idx, run1, workload=StubWorkload()).done == 5
    assert_results_consistent(idx, run1, res, samples=3)
    views = {c.id: c for c in idx.run_cells(run1)}
    ids = list(views)
    truncated, shortened, foreign, donor, intact = ids
    file = {cid: result_file(res, v) for cid, v in views.items()}  # each cell's one part
    _cut_bytes(file[truncated])
    _keep_rows(file[shortened], 1)
    shutil.copyfile(file[donor], file[foreign])
    untouched = {cid: _digest(file[cid]) for cid in (donor, intact)}

    # what submit / --dry-run see: the three damaged cells are not done, and why
    p = service.plan(idx, parse_grid(stub_grid()))
    assert p.done == {donor, intact}
    assert set(p.invalid) == {truncated, shortened, foreign}
    assert p.invalid[truncated].startswith("unreadable parquet: ")
    assert p.invalid[shortened] == "1 rows, index says 3"
    assert p.invalid[foreign] == f"holds cell {donor}"
    assert {c.id for c in p.to_run} == {truncated, shortened, foreign}

    # resubmit: a new run of the same grid recomputes exactly those three
    idx2, run2, plan2 = new_run(paths["db"], res, stub_grid(workers=1))
    assert {c.id for c in plan2.to_run} == {truncated, shortened, foreign}
    out = service.execute_run(idx2, run2, workload=StubWorkload())
    assert (out.done, out.failed, out.attempts) == (3, 0, 3)
    assert sorted(a.cell_id for a in idx2.run_attempts(run2)) == sorted([truncated, shortened, foreign])
    for cid in (truncated, shortened, foreign):
        table = pq.read_table(file[cid])
        assert set(table.column("cell_id").to_pylist()) == {cid} and table.num_rows == 3
        assert set(table.column("run_id").to_pylist()) == {run2}  # rewritten by the run that recomputed it
        assert verify_cell(idx2.get_cell(cid)) is None
    assert {cid: _digest(file[cid]) for cid in untouched} == untouched
    assert [a.state for a in idx2.cell_attempts(foreign)] == ["done", "done"]
    assert_all_verified(idx2, run2)

    # resume of the first run: a truncated file and a file from before rows named their cell
    _cut_bytes(file[intact])
    rows = pq.read_table(file[donor]).drop_columns(["cell_id"])
    pq.write_table(rows, file[donor])
    before = {cid: _digest(file[cid]) for cid in (truncated, shortened, foreign)}
    out = service.execute_run(idx, run1, workload=StubWorkload())
    assert (out.done, out.attempts) == (2, 2)
    assert sorted(a.cell_id for a in idx.run_attempts(run1)) == sorted(ids + [intact, donor])
    assert {cid: _digest(file[cid]) for cid in before} == before  # the good ones were not touched
    assert idx.get_run(run1).state == "done"
    assert_all_verified(idx, run1)
    done_attempts = {cid: sum(a.state == "done" for a in idx.cell_attempts(cid)) for cid in ids}
    assert done_attempts == {truncated: 2, shortened: 2, foreign: 2, donor: 2, intact: 2}


def assert_all_verified(idx: RunIndex, run_id: str) -> None:
    """Every cell of the run is done and its file checks out."""
    cells = idx.run_cells(run_id)
    assert all(c.state == "done" for c in cells)
    assert [verify_cell(c) for c in cells] == [None] * len(cells)


def test_scheduler_skips_a_cell_done_elsewhere_only_if_its_file_checks_out(paths):
    idx, run_id, p = new_run(paths["db"], paths["results"], stub_grid())
    cell = p.cells[0]
    sched = Scheduler(idx, run_id, p.cells, StubWorkload(), str(paths["results"]), SchedulerConfig())
    assert not sched.done_elsewhere(cell)  # pending

    att = idx.start_attempt(run_id, cell.id, "w", "n")  # "another run" finishes it meanwhile
    table = _cell_table(cell, run_id, n=3)
    rel = write_cell_rows(paths["results"], cell.id, table)
    idx.finish_attempt_done(att, results_dir=str(paths["results"]), result_path=rel, n_rows=3, summary={},
                            duration_s=0.1, peak_memory_bytes=None, worker="w", node="n")
    assert sched.done_elsewhere(cell) and sched.progress.done == 1

    _keep_rows(paths["results"] / rel, 2)
    assert not sched.done_elsewhere(cell) and sched.progress.done == 1
