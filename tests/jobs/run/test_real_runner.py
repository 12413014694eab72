"""One small grid through the real engine + evals runner (random:llama-tiny), then ``rescore``."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("kdeval.evals.task_run.runner")

from typer.testing import CliRunner  # noqa: E402

from kdeval.jobs.run import service  # noqa: E402
from kdeval.jobs.run.rescore import rescore_run  # noqa: E402
from kdeval.storage import read_cell_rows, write_cell_rows  # noqa: E402

from tests.support.helpers import assert_results_consistent, new_run  # noqa: E402

GRID = """
name: tiny-real
models: [random:llama-tiny]
policies: [full, keydiff, sink]
budgets: [96]
chunk_sizes: [64]
tasks:
  - {name: needle, lengths: [512], samples: 2, params: {haystack: noise, depths: [25, 75]}}
generation: {max_new_tokens: 4}
resources: {workers: 1}
"""


def test_real_cells_store_rows_and_rescore_restores_scores(local_ray, app, paths):
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID)
    assert len(plan.cells) == 3
    out = service.execute_run(idx, run_id)
    assert (out.done, out.failed, out.model_loads) == (3, 0, 1), [c.error_line for c in idx.run_cells(run_id)]
    assert_results_consistent(idx, run_id, paths["results"], samples=2)
    for cell in idx.run_cells(run_id):
        rows = idx.read_cell_rows(cell.id)
        assert len({r["id"] for r in rows}) == 2 and all(r["task"] == "needle" for r in rows)
        assert all(r["prompt_tokens"] > 0 and r["generated_tokens"] <= 4 for r in rows)
        # a sample computed with steps shared among cells has no process peak of its own; the cell's peak is
        # the most its samples timed alone reached
        assert all((r["peak_memory_bytes"] is None) == (r["execution"] == "shared") for r in rows), rows
        own = [r["peak_memory_bytes"] for r in rows if r["peak_memory_bytes"] is not None]
        assert own and cell.peak_memory_bytes == max(own)
        assert set(cell.summary) >= {"n"} and cell.summary["n"] == 2
        if cell.policy != "full":
            assert max(r["peak_kv_tokens"] for r in rows) <= 96 + 64  # budget + chunk

    # tamper with one stored score; rescore recomputes it from the stored prediction
    cell = idx.run_cells(run_id)[0]
    rows = read_cell_rows(cell.results_dir, cell.result_path)
    original = rows[0]["score"]
    rows[0]["score"] = 0.5
    write_cell_rows(cell.results_dir, cell.id, rows)
    res = CliRunner().invoke(app, ["rescore", run_id, "--db", str(paths["db"])])
    assert res.exit_code == 0 and "rescored 3 cells (6 rows, 1 scores changed)" in res.output, res.output
    assert rescore_run(idx, run_id).changed == 0  # idempotent
    assert idx.read_cell_rows(cell.id)[0]["score"] == original


def test_thinking_strip_reaches_the_worker_and_rescore_scores_the_answer(local_ray, paths):
    fixtures_dir = Path(__file__).resolve().parents[2] / "fixtures"
    grid = f"""
name: tiny-thinking
models: [random:llama-tiny]
policies: [keydiff]
budgets: [96]
chunk_sizes: [64]
tasks:
  - {{name: aime2025, samples: 1, params: {{data_dir: "{fixtures_dir}"}}}}
generation: {{max_new_tokens: 4, thinking: strip}}
resources: {{workers: 1}}
"""
    idx, run_id, plan = new_run(paths["db"], paths["results"], grid)
    assert service.execute_run(idx, run_id).done == 1
    cell = idx.run_cells(run_id)[0]
    rows = read_cell_rows(cell.results_dir, cell.result_path)
    assert "answer" in rows[0] and rows[0]["generated_tokens"] <= 4  # the grid's length bounds the reasoning one
    # the raw prediction is right, the answer (after the thinking block) is not: rescore scores the answer
    rows[0].update(prediction="<think>\\boxed{9}</think>", answer="", references=["9"], score=1.0)
    write_cell_rows(cell.results_dir, cell.id, rows)
    assert rescore_run(idx, run_id).changed == 1
    assert idx.read_cell_rows(cell.id)[0]["score"] == 0.0
