"""Real cells (random:llama-tiny through the engine and the evals runner) computed in sample shards give the
rows and the summary of the same cells in one piece, also when a shard boundary splits questions that share
a context (phonebook: one book, four questions), and for multi-turn conversations (a row per sample and turn)."""
from __future__ import annotations

import pytest

pytest.importorskip("kdeval.evals.task_run.runner")

from kdeval.jobs.run import service  # noqa: E402

from tests.support.helpers import new_run  # noqa: E402

GRID = """
name: tiny-real-shards
models: [random:llama-tiny]
policies: [full, keydiff]
budgets: [96]
chunk_sizes: [64]
tasks:
  - {{name: needle, lengths: [512], samples: 4, params: {{haystack: noise, depths: [10, 40, 60, 90]}}}}
  - {{name: phonebook, lengths: [384], samples: 4, params: {{num_books: 1, questions_per_book: 4}}}}
  - {{name: turns.kv, lengths: [512], samples: 4, params: {{turns: 2}}}}
generation: {{max_new_tokens: 4}}
resources: {{workers: 1, shard_size: {shard_size}}}
"""
#: What the samples computed: not timings, nor which shard shared a context with its neighbours.
SAME = ["id", "prompt_hash", "prompt_tokens", "prediction", "generated_tokens", "score", "peak_kv_tokens",
        "kept_tokens", "length", "depth", "turn", "question", "answer_fed"]


def _timing_free(summary: dict) -> dict:
    """The summary less latencies, the process's peak memory (both vary from run to run) and how many rows were
    computed in a group (a shard that does not hold the first samples times none alone)."""
    return {k: v for k, v in summary.items()
            if not k.startswith("mean_") and k not in ("max_peak_memory_bytes", "shared_rows")}


def test_real_cells_in_shards_equal_the_cells_in_one_piece(local_ray, paths):
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID.format(shard_size=3))
    assert len(plan.cells) == 6
    out = service.execute_run(idx, run_id)
    assert (out.done, out.failed, out.attempts) == (6, 0, 12), [c.error_line for c in idx.run_cells(run_id)]
    whole = paths["tmp"] / "whole"
    idx1, run1, _ = new_run(whole / "index.sqlite", whole / "results", GRID.format(shard_size=32))
    assert service.execute_run(idx1, run1).attempts == 6

    for cell in idx.run_cells(run_id):
        assert [(s.start, s.stop) for s in idx.cell_shards(cell.id)] == [(0, 3), (3, 4)]
        sharded, one = idx.read_cell_table(cell.id), idx1.read_cell_table(cell.id)
        assert sharded.column_names == one.column_names
        same = [c for c in SAME if c in one.column_names]  # a conversation's columns are its cells' only
        assert sharded.select(same).to_pylist() == one.select(same).to_pylist()
        if cell.task.startswith("turns"):
            assert sharded.column("turn").to_pylist() == [1, 2] * 4
        assert _timing_free(cell.summary) == _timing_free(idx1.get_cell(cell.id).summary)
        if cell.task.startswith("phonebook"):  # the split group: questions 0-2 share the book, 3 alone
            assert sharded.column("context_shared").to_pylist() == [True, True, True, False]
            assert one.column("context_shared").to_pylist() == [True] * 4
