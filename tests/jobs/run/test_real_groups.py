"""Real cells (random:llama-tiny through the engine and the evals runner) computed in groups give the per-sample
rows of the same cells run alone (``execution: {share: false}``), timings aside: several policies, chunked and
one-shot, both protocols, a task whose questions share a context (phonebook), a group of two sample shards streamed
one by one, and a group of one.

The first grids run at batch 1, where every figure but timings is the same; the last leaves the batch size unset
(chunked cells fork then batch at the worker's default), where a row's ``kv_cache_bytes`` and ``peak_kv_bytes``
are its share of its batch's buffers (:func:`kdeval.evals.task_run.runner.run_task`) and its batch is not always alone's."""
from __future__ import annotations

import pytest

pytest.importorskip("kdeval.evals.task_run.runner")

from kdeval.jobs.run import service  # noqa: E402
from tests.support.helpers import HOW_COMPUTED, cell_rows, new_run  # noqa: E402

GRID = """
name: tiny-real-groups
models: [random:llama-tiny]
policies: [full, snapkv]
budgets: [96]
chunk_sizes: [64, whole]
protocol: [{{compress: prompt}}, {{compress: context}}]
tasks:
  - {{name: needle, lengths: [512], samples: 3, params: {{haystack: noise, depths: [10, 50, 90]}}}}
  - {{name: phonebook, lengths: [384], samples: 3, params: {{num_books: 1, questions_per_book: 3}}}}
generation: {{max_new_tokens: 3, batch_size: 1}}
resources: {{workers: 1, shard_size: 2}}
execution: {{share: {share}}}
"""


def test_real_cells_in_groups_equal_the_cells_run_alone(local_ray, paths):
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID.format(share="true"))
    assert len(plan.cells) == 2 * 2 * (1 + 2)  # tasks x chunks x (full + snapkv x 2 protocols)
    # a group runs samples (0, 2) then (2, 3) of every cell; stored in shards of one sample as it finishes them
    out = service.execute_run(idx, run_id, stream_size=1)
    assert (out.done, out.failed) == (12, 0), [c.error_line for c in idx.run_cells(run_id)]
    assert out.attempts == 36  # one per shard: (0, 1), (1, 2) and (2, 3) of each cell
    alone = paths["tmp"] / "alone"
    idx1, run1, plan1 = new_run(alone / "index.sqlite", alone / "results", GRID.format(share="false"))
    assert [c.id for c in plan1.cells] == [c.id for c in plan.cells]
    assert service.execute_run(idx1, run1).done == 12

    executions = {r["execution"] for c in idx.run_cells(run_id) for r in idx.read_cell_table(c.id).to_pylist()}
    assert executions == {"alone", "shared"}  # the first samples timed alone, the others shared
    assert {r["execution"] for c in idx1.run_cells(run1) for r in idx1.read_cell_table(c.id).to_pylist()} == {"alone"}
    for cell in idx.run_cells(run_id):
        shared, one = cell_rows(idx, cell.id), cell_rows(idx1, cell.id)
        differ = sorted({k for a, b in zip(shared, one) for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
        assert len(shared) == len(one) == 3 and not differ, (cell.policy, cell.chunk_size, cell.task, differ)


BATCHED = """
name: tiny-batched-groups
models: [random:llama-tiny]
policies: [full, snapkv, keydiff]
budgets: [96]
chunk_sizes: [{chunk}]
tasks:
  - {{name: needle, lengths: [512], samples: 3, params: {{haystack: noise, depths: [10, 50, 90]}}}}
generation: {{max_new_tokens: 3}}
resources: {{workers: 1}}
execution: {{share: {share}}}
"""


def _shared_and_alone(paths, chunk):
    """The BATCHED grid at ``chunk`` run shared and alone: (index, run id) of each."""
    idx, run_id, plan = new_run(paths["db"], paths["results"], BATCHED.format(share="true", chunk=chunk))
    assert service.execute_run(idx, run_id).done == 3
    alone = paths["tmp"] / "alone"
    idx1, run1, _ = new_run(alone / "index.sqlite", alone / "results", BATCHED.format(share="false", chunk=chunk))
    assert service.execute_run(idx1, run1).done == 3
    for store, run in ((idx, run_id), (idx1, run1)):  # the buffers allocated around a row hold its own tokens
        assert all(r["kv_buffer_bytes"] >= r["peak_kv_bytes"] > 0 for c in store.run_cells(run)
                   for r in store.read_cell_table(c.id).to_pylist())
    return (idx, run_id), (idx1, run1)


def test_chunked_cells_at_the_default_batch_fork_then_batch(local_ray, paths):
    """A grid that leaves the batch size unset runs chunked cells at the worker's default (8 on a CPU) shared or
    not; in a group each sample's steps up to a cell's fork are replayed, the rest run in the cell's batch. Every
    row's figures are alone's, its ``peak_kv_bytes`` included (the K/V bytes its own tokens held under its
    policy); only the buffers allocated for its batch (``kv_buffer_bytes``) say how it ran, like timings: the
    timed first sample is a batch of its own, and alone's batch is of three."""
    (idx, run_id), (idx1, run1) = _shared_and_alone(paths, 64)
    for cell in idx.run_cells(run_id):
        rows = idx.read_cell_table(cell.id).to_pylist()
        assert [r["execution"] for r in rows] == ["alone", "shared", "shared"], cell.policy
        assert rows[1]["timing_batch"] == rows[2]["timing_batch"] != rows[0]["timing_batch"]  # one batch after
        assert cell_rows(idx, cell.id) == cell_rows(idx1, cell.id), cell.policy
    replayed = {c.policy: [r["replayed_steps"] for r in idx.read_cell_table(c.id).to_pylist()]
                for c in idx.run_cells(run_id)}
    assert sum(sum(v[1:]) for v in replayed.values()) >= 2 * 2  # two cells replay each later sample's first chunks
    idx.close()
    idx1.close()


def test_one_shot_rows_report_their_own_kv_bytes_shared_or_alone(local_ray, paths):
    """One-shot cells in a group share their whole steps at batch 1, alone they run at batch 8: each row's
    ``peak_kv_bytes`` is the same, the whole prompt its one forward held (whatever the policy keeps after; full
    grows by the tokens it decodes), not the buffers around it."""
    (idx, run_id), (idx1, run1) = _shared_and_alone(paths, "whole")
    peaks = {}
    for cell in idx.run_cells(run_id):
        assert {r["execution"] for r in idx.read_cell_table(cell.id).to_pylist()} == {"alone", "shared"}
        assert cell_rows(idx, cell.id) == cell_rows(idx1, cell.id), cell.policy
        peaks[cell.policy] = [r["peak_kv_bytes"] for r in cell_rows(idx, cell.id)]
    assert peaks["snapkv"] == peaks["keydiff"] and all(f > s for f, s in zip(peaks["full"], peaks["snapkv"])), peaks
    idx.close()
    idx1.close()


def test_a_group_that_times_nothing_shares_every_sample_and_says_so(local_ray, paths):
    """``execution: {time_first: false}`` (accuracy-only grids): no sample runs alone to be timed; every row is
    computed with shared steps, carries no TTFT, and is otherwise the row alone gives it; the speed report says
    the cell was not timed."""
    from types import SimpleNamespace

    import numpy as np

    from kdeval.jobs.reports.perf import timed_note

    text = BATCHED.format(share="true", chunk=64).replace("share: true}", "share: true, time_first: false}")
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)
    assert service.execute_run(idx, run_id).done == 3
    alone = paths["tmp"] / "alone"
    idx1, run1, _ = new_run(alone / "index.sqlite", alone / "results", BATCHED.format(share="false", chunk=64))
    assert service.execute_run(idx1, run1).done == 3
    for cell in idx.run_cells(run_id):
        rows = idx.read_cell_table(cell.id).to_pylist()
        assert [(r["execution"], r["ttft_s"]) for r in rows] == [("shared", None)] * 3, cell.policy
        assert cell_rows(idx, cell.id) == cell_rows(idx1, cell.id), cell.policy
        assert cell.summary["shared_rows"] == 3
        perf = {"ttft_s": np.array([np.nan] * 3), "decode_s": np.array([0.1] * 3)}
        note = timed_note(SimpleNamespace(samples=[None] * 3, perf=perf, view=cell))
        assert note == "not timed: every sample ran with shared steps (execution: {time_first: false})"
    idx.close()
    idx1.close()
