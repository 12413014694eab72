"""Reports with budgets as a share of the prompt: "25%" and the N tokens it may resolve to are separate rows,
labelled as such in every format, ordered (no budget, tokens, shares), and never on one plot axis."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render import formats
from kdeval.jobs.reports.render.plots import budget_figure, needle_heatmaps, score_vs_budget
from kdeval.jobs.reports.render.views import headline_rows, headline_views
from tests.jobs.reports.helpers import FakeCell, rows, store_run


def _report(store):
    idx, res = store
    cells = [FakeCell("full", None, rows=rows([1.0] * 4, depths=[25.0, 75.0]))]
    for budget, scores in ((256, [1.0, 1.0, 0.0, 0.0]), (512, [1.0] * 4), ("25%", [1.0, 0.0, 0.0, 0.0]),
                           ("12.5%", [0.0] * 4)):
        cells.append(FakeCell("keydiff", budget, rows=rows(scores, depths=[25.0, 75.0])))
    store_run(idx, res, "r1", cells)
    return build_report(idx, ["r1"], ReportOptions(resamples=0))


def test_share_rows_are_their_own_and_labelled(store):
    rep = _report(store)
    head = {(r.policy, r.budget): r.value for r in headline_rows(rep.scores)}
    # the share cells keep their own scores, apart from the token cells
    assert head == {("full", None): 100.0, ("keydiff", 256): 50.0, ("keydiff", 512): 100.0,
                    ("keydiff", "25%"): 25.0, ("keydiff", "12.5%"): 0.0}
    [view] = headline_views(rep)
    assert [label for label, _ in view.rows] == ["full", "keydiff N=256", "keydiff N=512", "keydiff N=12.5%",
                                                 "keydiff N=25%"]
    assert "| keydiff | 25% |" in formats.to_markdown(rep)
    assert formats.from_json(formats.to_json(rep)) == rep
    assert {p["budget"] for p in json.loads(formats.to_json(rep))["perf"]} == {None, 256, 512, "25%", "12.5%"}


def test_terminal_report_shows_the_share(store):
    idx, _ = store
    _report(store)
    res = CliRunner().invoke(app, ["report", "r1", "--db", str(idx.engine.url), "--resamples", "0"])
    assert res.exit_code == 0, res.output
    lines = [ln.split() for ln in res.output.splitlines() if "25%" in ln.split()]
    assert len(lines) == 4  # scores, speed, answer length, memory
    assert lines[0][:5] == ["keydiff", "25%", "needle", "4", "25.00"] and lines[0][5] == "-75.00"


def test_shares_and_tokens_never_share_a_plot_axis(store):
    rep = _report(store)
    plots = score_vs_budget(rep)
    assert [p.title for p in plots] == ["needle vs budget — m, B=64",
                                        "needle vs budget (share of the prompt) — m, B=64"]
    assert len({p.slug for p in plots}) == 2
    shares = [r for r in headline_rows(rep.scores) if r.budget is None or isinstance(r.budget, str)]
    [ax] = budget_figure("t", shares).axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["12.5%", "25%"]
    assert ax.get_xlabel().startswith("KV budget: share of each prompt")
    with pytest.raises(ValueError, match="^rows: budgets in tokens and shares of the prompt cannot share"):
        budget_figure("t", headline_rows(rep.scores))
    titles = [p.title for p in needle_heatmaps(rep)]
    assert titles == [f"needle accuracy — m, B=64, N={b}" for b in (256, 512, "12.5%", "25%")]
