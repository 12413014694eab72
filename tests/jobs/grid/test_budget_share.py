"""Budgets as a share of the prompt through the service: grid errors (exit 2), cell identity, and a real run
on random:llama-tiny whose stored rows, index, export and Python API say the budget was a share."""
from __future__ import annotations


import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.storage import RunIndex

from tests.support.helpers import new_run

GRID = """
models: [random:llama-tiny]
policies: [full, keydiff, {{name: sink, params: {{n_sink_tokens: 4}}}}]
budgets: {budgets}
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [512], samples: 2, params: {{haystack: noise, depths: [25, 75]}}}}]
protocol: {{compress: context}}
"""

#: The ids of GRID with budgets [64, 256] at code version "0.1.0+pinned", computed by kdeval before share
#: budgets existed: an absolute budget's cell keeps its id (and its stored result).
PINNED = {
    ("full", None): "b1cac32e6225e2236c9d9d7b",
    ("keydiff", 64): "f3e89ad6a859275e68485600",
    ("keydiff", 256): "b1abe5bd0fcec2c295206998",
    ("sink", 64): "eb712bd8bd98c763a7e134c9",
    ("sink", 256): "192c3773cb6e97d3f60a336f",
}


def _cells(budgets: str):
    return {(c.policy, c.budget): c for c in expand(parse_grid(GRID.format(budgets=budgets)), version="0.1.0+pinned")}


def test_absolute_cells_keep_their_ids_and_a_share_is_another_cell():
    cells = _cells("[64, 256, 25%, 12.50%]")
    assert {k: cells[k].id for k in PINNED} == PINNED
    share = cells[("keydiff", "25%")]
    assert len({c.id for c in cells.values()}) == len(cells) == 9  # full once, 2 policies x 4 budgets
    assert ("keydiff", "12.5%") in cells
    assert share.model_dump(mode="json")["budget"] == "25%"
    assert "N=25%" in share.describe() and "N=256" in cells[("keydiff", 256)].describe()
    # "25%" of 512-ish prompts and the 128 tokens it is near are different cells; so are 25% and 25.0%
    assert _cells("[128, 25.0%]")[("keydiff", "25%")].id == share.id != _cells("[128]")[("keydiff", 128)].id
    rec = share.record()
    assert (rec.budget, rec.budget_share) == (None, 0.25)
    assert (cells[("keydiff", 64)].record().budget, cells[("keydiff", 64)].record().budget_share) == (64, None)


@pytest.mark.parametrize("budgets,expected", [
    ("[64, 150%]", "budgets[1]: expected a positive number of tokens or a share of the prompt such as \"25%\" "
                   "(0 < share <= 100) (got '150%')"),
    ("[0%]", "budgets[0]: expected a positive number of tokens or a share of the prompt such as \"25%\" "
             "(0 < share <= 100) (got '0%')"),
    ("[abc%]", "budgets[0]: expected a positive number of tokens or a share"),
    ("[25%, 25.0%]", "budgets: values must be distinct"),
])
def test_a_bad_share_is_a_grid_error_exit_2(app, paths, budgets, expected):
    grid = paths["tmp"] / "bad.yaml"
    grid.write_text(GRID.format(budgets=budgets))
    r = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir",
                                 str(paths["results"])])
    assert r.exit_code == 2 and expected in " ".join(r.output.split()), r.output
    assert not paths["results"].exists()


REAL = """
name: tiny-share
models: [random:llama-tiny]
policies: [keydiff]
budgets: [25%, {n}]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [512], samples: 2, params: {{haystack: noise, depths: [25, 75]}}}}]
generation: {{max_new_tokens: 1, batch_size: {batch}}}
resources: {{workers: 1}}
"""


def test_a_share_cell_runs_stores_and_exports_what_it_kept(local_ray, paths):
    """One generated token: the cache ends at exactly kvpress's N = int(prompt × 0.25) per sample. The share cell's rows
    say so (``resolved_budget``, ``budget_share``); the absolute cell at that N is another cell, with the
    same kept counts; batch 2 stores the rows of batch 1."""
    from kdeval.api import load_results

    n = 128  # about 25% of the needle's 512-token prompts
    idx, run_id, plan = new_run(paths["db"], paths["results"], REAL.format(n=n, batch=1))
    out = service.execute_run(idx, run_id)
    assert (out.done, out.failed) == (2, 0), [c.error_line for c in idx.run_cells(run_id)]
    views = {v.grid_budget: v for v in idx.run_cells(run_id)}
    share, absolute = views["25%"], views[n]
    assert (share.budget, share.budget_share, absolute.budget, absolute.budget_share) == (None, 0.25, n, None)
    rows = idx.read_cell_rows(share.id)
    for r in rows:
        assert r["resolved_budget"] == r["kept_tokens"] == int(r["prompt_tokens"] * (1 - 0.75))
        assert (r["budget"], r["budget_share"]) == (None, 0.25)
    assert all((r["budget"], r["budget_share"], r["resolved_budget"]) == (n, None, n)
               for r in idx.read_cell_rows(absolute.id))
    table = pq.read_table(paths["results"] / share.result_path)
    assert table.schema.field("budget_share").type == "double" and table.schema.field("budget").type == "int64"

    df = load_results(paths["db"], run_id)
    by = df.set_index("cell_id")
    assert set(by.loc[share.id, "budget_share"]) == {0.25} and by.loc[share.id, "budget"].isna().all()
    assert list(by.loc[absolute.id, "budget"]) == [n, n]

    # batch 2: another run of the same cells (batch size is not identity): recompute them apart and compare
    other = paths["tmp"] / "batched"
    idx2, run2, plan2 = new_run(other / "index.sqlite", other / "results", REAL.format(n=n, batch=2))
    assert [c.id for c in plan2.cells] == [c.id for c in plan.cells]
    assert service.execute_run(idx2, run2).done == 2
    timing = {"ttft_s", "decode_s", "shared_prefill_s", "kv_buffer_bytes", "peak_memory_bytes", "peak_kv_bytes", "run_id", "timing_batch",
              "execution", "replayed_steps"}  # how a row was computed (the batch-2 run is alone), not what
    for cell in plan.cells:
        one = [{k: v for k, v in r.items() if k not in timing} for r in idx.read_cell_rows(cell.id)]
        two = [{k: v for k, v in r.items() if k not in timing} for r in idx2.read_cell_rows(cell.id)]
        assert one == two
    idx2.close()
    idx.close()


def test_an_index_without_the_share_column_opens_and_gains_it(paths):
    import sqlite3

    RunIndex.open(paths["db"]).close()
    con = sqlite3.connect(paths["db"])
    con.execute("ALTER TABLE cells DROP COLUMN budget_share")  # as an index made before share budgets
    con.commit()
    con.close()
    idx, run_id, _ = new_run(paths["db"], paths["results"], GRID.format(budgets="[25%]"))
    assert {v.grid_budget for v in idx.run_cells(run_id)} == {None, "25%"}
    assert {v.budget_share for v in idx.run_cells(run_id)} == {None, 0.25}
    idx.close()


TOO_SMALL = """
models: [random:llama-tiny]
policies: [{name: sink, params: {n_sink_tokens: 16}}]
budgets: [1%]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [512], samples: 1, params: {haystack: noise, depths: [50]}}]
generation: {max_new_tokens: 1}
retries: {max_attempts: 1}
"""


def test_a_share_below_what_the_policy_keeps_is_noted_then_fails_its_cell(local_ray, paths):
    idx, run_id, plan = new_run(paths["db"], paths["results"], TOO_SMALL)
    assert plan.notes == ["budgets: 1% of tasks[0] (needle) at length 512 is about N=5; must be >= the 16 tokens "
                          "policy 'sink' always keeps (n_sink=16 + recent=0), got 5 (policies[0]): its samples "
                          "will fail"]
    out = service.execute_run(idx, run_id)
    assert (out.done, out.failed) == (0, 1)
    [cell] = idx.run_cells(run_id)
    # kvpress's N = int(510 × (1 - 0.99)) = int(5.1000000000000005) = 5
    assert cell.error_line == ("kdeval.evals.tasks.base.EvalError: budget: 1% of sample 'needle/L512/D50' (510 prompt "
                               "tokens) is N=5; must be >= the 16 tokens policy 'sink' always keeps (n_sink=16 + "
                               "recent=0), got 5")
    idx.close()
