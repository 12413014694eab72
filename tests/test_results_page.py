"""bench/results_page.py and examples/paper-claims/: the grids validate offline at the size the page needs, a slice cuts
them to minutes, and the claims are decided from paired margins (synthetic stored results, no model)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard
from kdeval.jobs.reports.leaderboard.cells import Filters
from kdeval.jobs.reports.samples import load_cell
from tests.jobs.reports.helpers import FakeCell, rows, store_run

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_claims import (CONTRADICTED, SUPPORTED, UNRESOLVED, claim_gap_grows,  # noqa: E402
                            claim_keydiff_vs_baselines, claim_window_helps, overall)
from results_page import slice_grid  # noqa: E402

GRIDS = sorted((REPO / "examples" / "paper-claims").glob("*.yaml"))


@pytest.mark.parametrize("grid, cells, samples", [("smollm2_2k.yaml", 26, 30), ("smollm2_4k.yaml", 5, 30)])
def test_grids_validate_at_the_size_the_page_needs(grid, cells, samples, tmp_path):
    res = CliRunner().invoke(app, ["submit", str(REPO / "examples" / "paper-claims" / grid), "--dry-run",
                                   "--db", str(tmp_path / "no" / "index.sqlite")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"{cells} cells, 0 already done" in res.output
    spec = yaml.safe_load((REPO / "examples" / "paper-claims" / grid).read_text())
    assert all(t["samples"] >= samples for t in spec["tasks"]) and spec["chunk_sizes"] == [128]


def test_a_slice_is_minutes_not_an_hour():
    spec = yaml.safe_load(GRIDS[0].read_text())
    cut = slice_grid(spec)
    assert cut["policies"] == ["full", "keydiff", "sink"] and cut["budgets"] == spec["budgets"][:1]
    assert [t["samples"] for t in cut["tasks"]] == [2] and cut["name"].endswith("-slice")


def test_claims_are_decided_by_paired_margins(store):
    idx, res = store
    win = {"window_fraction": 0.25}
    n = 40
    store_run(idx, res, "r", [
        FakeCell("full", None, length=2048, rows=rows([1.0] * n)),
        FakeCell("keydiff", 256, length=2048, rows=rows([1.0] * 36 + [0.0] * 4)),
        FakeCell("keydiff", 256, length=2048, params=win, rows=rows([1.0] * 36 + [0.0] * 4)),
        FakeCell("sink", 256, length=2048, rows=rows([1.0] * 10 + [0.0] * 30)),
        FakeCell("tova", 256, length=2048, rows=rows([1.0] * 20 + [0.0] * 20)),
        FakeCell("full", None, length=4096, rows=rows([1.0] * n)),
        FakeCell("keydiff", 256, length=4096, rows=rows([1.0] * 38 + [0.0] * 2)),
        FakeCell("tova", 256, length=4096, rows=rows([1.0] * 2 + [0.0] * 38)),
    ])
    board = build_leaderboard(idx, Filters(), LeaderboardOptions(resamples=300))

    def samples(cell_id):
        return load_cell(idx.get_cell(cell_id), "r").samples

    boot = dict(resamples=300, seed=0, confidence=0.95)
    first = claim_keydiff_vs_baselines(board, samples, **boot)
    assert [(f.where.split()[1], f.compared, f.verdict) for f in first] == [
        ("needle@2048#s0", "keydiff − tova (best baseline)", SUPPORTED),
        ("needle@4096#s0", "keydiff − tova (best baseline)", SUPPORTED)]
    assert first[0].margin == pytest.approx(40.0) and first[0].n == n
    [gap] = claim_gap_grows(first)
    assert gap.margin == pytest.approx(90.0 - 40.0) and gap.verdict == SUPPORTED
    [window] = claim_window_helps(board, samples, **boot)
    assert window.margin == 0.0 and window.verdict.startswith(UNRESOLVED) and "retrieval" in window.verdict
    assert overall(1, first) == SUPPORTED and overall(3, [window]) == "not tested"
    flipped = [type(f)(**{**f.__dict__, "verdict": CONTRADICTED}) for f in first[:1]] + first[1:]
    assert overall(1, flipped) == "mixed (1 supported, 1 contradicted)"


def test_a_margin_from_few_pairs_decides_nothing(store):
    idx, res = store
    store_run(idx, res, "r", [FakeCell("full", None, rows=rows([1.0] * 4)), FakeCell("keydiff", 64, rows=rows([1.0] * 4)),
                              FakeCell("sink", 64, rows=rows([0.0] * 4))])
    board = build_leaderboard(idx, Filters(), LeaderboardOptions(resamples=50))
    [f] = claim_keydiff_vs_baselines(board, lambda c: load_cell(idx.get_cell(c), "r").samples, resamples=50, seed=0,
                                     confidence=0.95)
    assert f.margin == 100.0 and f.verdict == "not resolved (fewer than 10 pairs)" and overall(1, [f]) == UNRESOLVED
