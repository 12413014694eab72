"""Sample shards: one Parquet part per shard read and checked as one result; cells computed in shards on a
local Ray equal the same cells in one piece; a killed worker or a cancelled driver loses at most its shards."""
from __future__ import annotations

import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.identity import self_describing
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.jobs.run.shards import shard_ranges
from kdeval.storage import (
    clean_temp_files, list_result_files, list_temp_files, part_files, read_cell_table, remove_parts,
    temp_file_cell, verify_cell, verify_cell_file, write_cell_rows, write_part,
)

from tests.support.helpers import stub_grid
from tests.support.helpers import attempt_states, new_run

ONE_CELL = """
name: one-big-cell
models: ["stub:0"]
policies: [keydiff]
budgets: [64]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: {samples}, params: {{depths: {depths}}}}}]
resources: {{workers: {workers}, shard_size: {shard_size}}}
"""


def one_cell(samples: int, workers: int, shard_size: int) -> str:
    """A grid of one stub cell of ``samples`` samples (needle: one sample per depth)."""
    depths = [round(100 * i / max(samples - 1, 1)) for i in range(samples)]
    return ONE_CELL.format(samples=samples, workers=workers, shard_size=shard_size, depths=depths)


def _rows(lo: int, hi: int) -> list[dict]:
    return [{"id": f"s{i}", "score": float(i % 2), "references": ["a"]} for i in range(lo, hi)]


def test_shard_ranges_cover_the_samples_in_order():
    assert shard_ranges(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert shard_ranges(4, 32) == [(0, 4)]
    assert shard_ranges(0, 5) == [(0, 0)]
    with pytest.raises(ValueError, match="shard_size"):
        shard_ranges(4, 0)


def test_parts_read_as_one_table_and_are_checked_part_by_part(tmp_path):
    res = tmp_path / "results"
    a, b = expand(parse_grid(stub_grid()), version="t")[:2]
    rels = [write_part(res, a.id, i, self_describing(_rows(lo, hi), a, "r0"))
            for i, (lo, hi) in enumerate(shard_ranges(7, 3))]
    cell_dir = f"cells/{a.id[:2]}/{a.id}"
    assert rels == [f"{cell_dir}/part-{i:04d}.parquet" for i in range(3)]
    table = read_cell_table(res, cell_dir)
    assert table.column("id").to_pylist() == [f"s{i}" for i in range(7)]  # shard order = sample order
    assert verify_cell_file(res, cell_dir, a.id, 7) is None
    assert verify_cell_file(res, cell_dir, a.id, 8) == "7 rows, index says 8"

    # a temp file left in the directory is neither read nor checked; cleaning skips cells a driver writes
    tmp = res / cell_dir / "_tmp-part-0003-999.parquet"
    tmp.write_bytes(b"partial")
    assert temp_file_cell(tmp) == a.id and temp_file_cell(res / "cells/zz/_tmp-zzcell-12.parquet") == "zzcell"
    assert read_cell_table(res, cell_dir).num_rows == 7 and verify_cell_file(res, cell_dir, a.id, 7) is None
    assert clean_temp_files(res, skip_cells={a.id}) == 0 and tmp.exists()
    assert clean_temp_files(res) == 1 and list_temp_files(res) == []

    # rewriting rows in place (rescore) keeps each part's rows; a different count is refused
    rows = read_cell_table(res, cell_dir).to_pylist()
    rows[4]["score"] = 0.25
    assert write_cell_rows(res, a.id, rows) == cell_dir
    assert [pq.read_table(p).num_rows for p in part_files(res / cell_dir)] == [3, 3, 1]
    assert read_cell_table(res, cell_dir).column("score").to_pylist()[4] == 0.25
    with pytest.raises(ValueError, match=r"^rows: 6 rows for cell .* whose 3 parts hold 7"):
        write_cell_rows(res, a.id, rows[:6])

    # each part is checked: a foreign part, a missing part, no part at all
    other = write_part(tmp_path / "other", b.id, 0, self_describing(_rows(3, 6), b, "r0"))
    saved = (res / rels[1]).read_bytes()
    shutil.copyfile(tmp_path / "other" / other, res / rels[1])
    assert verify_cell_file(res, cell_dir, a.id, 7) == f"part-0001.parquet: holds cell {b.id}"
    (res / rels[1]).write_bytes(saved[: len(saved) // 2])
    assert verify_cell_file(res, cell_dir, a.id, 7).startswith("part-0001.parquet: unreadable parquet: ")
    (res / rels[1]).unlink()
    assert verify_cell_file(res, cell_dir, a.id, 7) == "4 rows, index says 7"
    assert remove_parts(res, a.id, keep={0}) == 1
    assert [p.name for p in part_files(res / cell_dir)] == ["part-0000.parquet"]
    remove_parts(res, a.id)
    assert verify_cell_file(res, cell_dir, a.id, 7) == f"no part files in {res / cell_dir}"


def test_one_file_results_of_older_runs_stay_readable(tmp_path):
    res = tmp_path / "results"
    (a,) = expand(parse_grid(stub_grid()), version="t")[:1]
    rel = write_cell_rows(res, a.id, self_describing(_rows(0, 4), a, "r0"))
    assert rel == f"cells/{a.id[:2]}/{a.id}.parquet"
    assert read_cell_table(res, rel).num_rows == 4 and verify_cell_file(res, rel, a.id, 4) is None
    assert list_result_files(res) == [res / rel]


def _cell_attempts(idx, cell_id):
    return sorted((a.shard, a.state) for a in idx.cell_attempts(cell_id))


def test_cells_in_shards_equal_the_cells_in_one_piece(local_ray, paths):
    text = stub_grid().replace("samples: 3", "samples: 7, params: {depths: [0, 15, 30, 50, 70, 85, 100]}")
    idx, run_id, plan = new_run(paths["db"], paths["results"], text)
    out = service.execute_run(idx, run_id, workload=StubWorkload(), shard_size=3)
    assert (out.done, out.failed, out.left, out.attempts) == (5, 0, 0, 15)
    assert attempt_states(idx, run_id) == {"done": 15}

    whole_dir = paths["tmp"] / "whole"
    one_worker = text.replace("workers: 2", "workers: 1")  # two workers would split the group over them
    idx1, run1, _ = new_run(whole_dir / "index.sqlite", whole_dir / "results", one_worker)
    # shard_size 32, a group streamed in shards of 32: one shard each
    assert service.execute_run(idx1, run1, workload=StubWorkload(), stream_size=32).attempts == 5

    for cell in idx.run_cells(run_id):
        assert (cell.state, cell.n_rows, cell.n_attempts, cell.held_by) == ("done", 7, 1, None)
        assert cell.result_path == f"cells/{cell.id[:2]}/{cell.id}"
        assert [p.name for p in part_files(paths["results"] / cell.result_path)] == [
            "part-0000.parquet", "part-0001.parquet", "part-0002.parquet"]
        assert _cell_attempts(idx, cell.id) == [(0, "done"), (1, "done"), (2, "done")]
        assert [(s.start, s.stop, s.n_rows) for s in idx.cell_shards(cell.id)] == [(0, 3, 3), (3, 6, 3), (6, 7, 1)]
        assert verify_cell(cell) is None
        whole = idx1.get_cell(cell.id)
        assert cell.summary == whole.summary and cell.summary["n"] == 7
        sharded = idx.read_cell_table(cell.id).drop_columns(["run_id"])
        assert sharded.equals(idx1.read_cell_table(cell.id).drop_columns(["run_id"]))  # same rows, same order


def test_shards_of_one_cell_run_on_two_workers_at_once(local_ray, paths):
    text = one_cell(samples=8, workers=2, shard_size=2)
    idx, run_id, plan = new_run(paths["db"], paths["results"], text)
    out = service.execute_run(idx, run_id, workload=StubWorkload(cost_per_sample_s=0.4))
    assert (out.done, out.attempts) == (1, 4)
    (cell,) = idx.run_cells(run_id)
    attempts = idx.cell_attempts(cell.id)
    assert sorted(a.shard for a in attempts) == [0, 1, 2, 3] and {a.state for a in attempts} == {"done"}
    assert len({a.worker for a in attempts}) == 2 and set(cell.worker.split(",")) == {"w0", "w1"}
    starts = sorted(attempts, key=lambda a: a.started_at)
    assert starts[1].started_at < starts[0].finished_at  # two shards of the cell were in flight together
    assert cell.duration_s == pytest.approx(sum(a.duration_s for a in attempts))  # worker time, all shards


def test_a_killed_worker_loses_only_its_shard(local_ray, paths):
    text = one_cell(samples=6, workers=1, shard_size=2)
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)
    out = service.execute_run(idx, run_id, workload=StubWorkload(crash_policies=("keydiff",),
                                                                 crash_marker_dir=str(paths["tmp"])))
    assert (out.done, out.failed, out.workers_lost) == (1, 0, 1)
    (cell,) = idx.run_cells(run_id)
    states = Counter((a.shard, a.state) for a in idx.cell_attempts(cell.id))
    assert states == {(0, "lost"): 1, (0, "done"): 1, (1, "done"): 1, (2, "done"): 1}
    assert cell.n_attempts == 2  # the most any shard took
    ids = idx.read_cell_table(cell.id).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 6 and cell.n_rows == 6


def test_resume_keeps_the_shards_a_cancelled_driver_stored(local_ray, paths):
    text = one_cell(samples=8, workers=1, shard_size=2)
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)

    def cancel_after_two_shards(p) -> None:
        if p.samples_done >= 4:
            service.cancel_run(idx, run_id)

    out = service.execute_run(idx, run_id, workload=StubWorkload(cost_per_sample_s=0.3), heartbeat_s=0.2,
                              on_progress=cancel_after_two_shards)  # noticed within 0.2 s: shard 3 is running
    assert out.cancelled and out.done == 0
    (cell,) = idx.run_cells(run_id)
    assert (cell.state, cell.held_by) == ("pending", None)
    kept = {s.shard: s.attempt_id for s in idx.cell_shards(cell.id)}
    assert 2 <= len(kept) < 4 and sorted(kept) == list(range(len(kept)))

    out2 = service.execute_run(idx, run_id, workload=StubWorkload())
    assert (out2.done, out2.attempts) == (1, 4 - len(kept))
    cell = idx.get_cell(cell.id)
    assert cell.state == "done" and cell.n_rows == 8 and verify_cell(cell) is None
    done = Counter(a.shard for a in idx.cell_attempts(cell.id) if a.state == "done")
    assert done == {0: 1, 1: 1, 2: 1, 3: 1}  # every shard computed exactly once
    assert {s.shard: s.attempt_id for s in idx.cell_shards(cell.id) if s.shard in kept} == kept


def test_a_failing_shard_fails_the_cell_and_its_other_shards_are_dropped(local_ray, paths):
    text = one_cell(samples=6, workers=1, shard_size=2)
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)
    out = service.execute_run(idx, run_id, workload=StubWorkload(fail_policies=("keydiff",)))
    assert (out.done, out.failed, out.attempts) == (0, 1, 1)
    (cell,) = idx.run_cells(run_id)
    assert cell.state == "failed" and cell.held_by is None and "stub failure injected" in cell.error_line
    assert idx.get_run(run_id).state == "failed"
