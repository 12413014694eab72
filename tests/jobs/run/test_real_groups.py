"""Real cells (random:llama-tiny through the engine and the evals runner) computed in groups give the per-sample
rows of the same cells run alone (``execution: {share: false}``), timings aside: several policies, chunked and
one-shot, both protocols, a task whose questions share a context (phonebook), two sample shards.

Both grids run at batch 1: a grid that leaves the batch size unset runs a cell alone at the worker's default (8
on a CPU) and in a group at 1 (sharing needs the batch-1 path), and a batch's rows give ``peak_kv_bytes`` as the
row's share of the batch's cache, which is not batch 1's figure (:func:`kdeval.evals.runner.run_task`)."""
from __future__ import annotations

import pytest

pytest.importorskip("kdeval.evals.runner")

from kdeval.jobs.run import service  # noqa: E402
from tests.support.helpers import cell_rows, new_run  # noqa: E402

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
    out = service.execute_run(idx, run_id)
    assert (out.done, out.failed) == (12, 0), [c.error_line for c in idx.run_cells(run_id)]
    assert out.attempts == 24  # one per shard: (0, 2) and (2, 3) of each cell
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
