"""Groups split by samples across idle workers: the rule (:func:`spread_shard_sizes`, known answers), the
scheduler planning fresh cells in those shard sizes (its flights run at once on every worker), and rows that do
not depend on how many workers computed them (stub and real cells, 1 worker vs 3)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.jobs.run.groups import group_shard_sizes, share_key, spread_shard_sizes, units_of_work
from tests.support.helpers import HOW_COMPUTED, cell_rows, new_run

GRID = """
name: spread
models: ["stub:0"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 8, params: {{depths: [0, 15, 30, 45, 55, 70, 85, 100]}}}}]
resources: {{workers: {workers}, cpus_per_worker: 0.5}}
"""


@pytest.mark.parametrize("samples,shard_size,workers,expected", [
    ({"a": 8}, 32, 4, {"a": 2}),  # 1 group of 8 on 4 workers: 4 shards of 2
    ({"a": 8, "b": 8}, 32, 4, {"a": 4, "b": 4}),  # 2 groups: each in 2 shards
    ({k: 8 for k in "abcde"}, 32, 4, {k: 32 for k in "abcde"}),  # 5 groups, 4 workers: unchanged
    ({"a": 8}, 2, 4, {"a": 2}),  # shard_size already small enough: unchanged
    ({"a": 8}, 1, 4, {"a": 1}),  # ... and never larger than shard_size
    ({"a": 3}, 32, 4, {"a": 1}),  # never below 1 sample: 3 shards of 1, one worker idle
    ({"a": 0}, 32, 4, {"a": 32}),  # a task of no samples: its one empty shard
    ({"a": 8}, 32, 1, {"a": 32}),  # one worker: unchanged
    ({"a": 100, "b": 4}, 32, 8, {"a": 15, "b": 32}),  # the workers go where the samples are: 7 shards and 1
    ({"a": 8, "b": 8, "c": 8}, 32, 4, {"a": 4, "b": 32, "c": 32}),  # the spare worker to one group
])
def test_spread_shard_sizes_known_answers(samples, shard_size, workers, expected):
    assert spread_shard_sizes(samples, shard_size, workers) == expected


def test_every_cell_of_a_share_key_gets_the_same_size_and_the_units_count_them():
    cells = expand(parse_grid(GRID.format(workers=4)), version="t")
    assert len(cells) == 5 and len({share_key(c) for c in cells}) == 1
    assert list(group_shard_sizes(cells, 32, 4).values()) == [2]
    assert units_of_work(cells, 32, share=True, workers=4) == 4
    assert units_of_work(cells, 32, share=True) == 1  # one worker: one group's shard
    assert units_of_work(cells, 32, share=False, workers=4) == 5  # alone: a shard per cell, as before


@dataclass(frozen=True)
class BarrierStub(StubWorkload):
    """:class:`StubWorkload` whose every call waits until ``parties`` calls have started (a marker file each in
    ``folder``; a worker process cannot share a Python barrier): the run only finishes when that many calls run
    at once, on that many workers."""

    folder: str = ""
    parties: int = 1
    timeout_s: float = 120.0

    def _wait(self, tasks) -> None:
        open(os.path.join(self.folder, f"{tasks[0].sample_start}-{time.monotonic_ns()}"), "w").close()
        deadline = time.monotonic() + self.timeout_s
        while len(os.listdir(self.folder)) < self.parties:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(os.listdir(self.folder))} of {self.parties} calls ran at once")
            time.sleep(0.05)

    def run_group(self, handle, tasks, on_samples=None, on_result=None):
        self._wait(tasks)
        return super().run_group(handle, tasks, on_samples, on_result)


def test_a_one_task_grid_spreads_over_every_worker(local_ray, paths):
    folder = paths["tmp"] / "barrier"
    folder.mkdir()
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID.format(workers=4))
    out = service.execute_run(idx, run_id, workload=BarrierStub(folder=str(folder), parties=4))
    assert (out.done, out.failed, out.left) == (5, 0, 0), [c.error_line for c in idx.run_cells(run_id)]
    assert out.attempts == 20 and len(os.listdir(folder)) == 4  # 4 group calls of 5 cells, all at once
    for cell in idx.run_cells(run_id):
        assert [(s.start, s.stop, s.shard_size) for s in idx.cell_shards(cell.id)] == [
            (0, 2, 2), (2, 4, 2), (4, 6, 2), (6, 8, 2)]
    attempts = idx.run_attempts(run_id)
    assert len({a.worker for a in attempts}) == 4
    for shard in range(4):  # each group on one worker, with its five cells
        assert len({a.worker for a in attempts if a.shard == shard}) == 1


def _rows(idx, run_id: str, drop: frozenset[str] | set[str]) -> dict[str, list[dict]]:
    return {c.id: cell_rows(idx, c.id, drop) for c in idx.run_cells(run_id)}


def test_stub_rows_on_1_and_3_workers_are_equal(local_ray, paths):
    runs = {}
    for workers in (1, 3):
        where = paths["tmp"] / f"w{workers}"
        idx, run_id, plan = new_run(where / "index.sqlite", where / "results", GRID.format(workers=workers))
        out = service.execute_run(idx, run_id, workload=StubWorkload())
        assert (out.done, out.failed) == (5, 0)
        sizes = {tuple((s.start, s.stop) for s in idx.cell_shards(c.id)) for c in plan.cells}
        runs[workers] = (_rows(idx, run_id, {"run_id"}), sizes)
    # 1 worker: one group call of the 8 samples, stored in shards of 4 as it finishes them (stream_size)
    assert runs[1][1] == {((0, 4), (4, 8))} and runs[3][1] == {((0, 3), (3, 6), (6, 8))}
    assert runs[1][0] == runs[3][0] and all(len(rows) == 8 for rows in runs[1][0].values())


REAL = """
name: tiny-real-spread
models: [random:llama-tiny]
policies: [full, snapkv]
budgets: [96]
chunk_sizes: [64]
tasks:
  - {{name: needle, lengths: [512], samples: 3, params: {{haystack: noise, depths: [10, 50, 90]}}}}
generation: {{max_new_tokens: 3, batch_size: 1}}
resources: {{workers: {workers}, cpus_per_worker: 0.5}}
"""


def test_real_rows_on_1_and_3_workers_are_equal(local_ray, paths):
    pytest.importorskip("kdeval.evals.task_run.runner")
    rows = {}
    for workers in (1, 3):
        where = paths["tmp"] / f"w{workers}"
        idx, run_id, plan = new_run(where / "index.sqlite", where / "results", REAL.format(workers=workers))
        out = service.execute_run(idx, run_id)
        assert (out.done, out.failed) == (2, 0), [c.error_line for c in idx.run_cells(run_id)]
        assert out.attempts == (2 if workers == 1 else 6)  # 3 workers: shards of 1 sample
        rows[workers] = _rows(idx, run_id, HOW_COMPUTED)
    assert rows[1] == rows[3] and all(len(r) == 3 for r in rows[1].values())
