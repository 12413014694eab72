"""Conversations in reports: score by turn against the full cache and turn 1, query dependence by turn, the
score-vs-turn figure, what compression broke (also ``kdeval report --broken``) and answer length."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.formats import from_json, to_json, to_markdown
from kdeval.jobs.reports.render.turn_plots import turn_plots
from tests.jobs.reports.helpers import FakeCell, rows, store_run

CTX = {"compress": "context", "decode": "evict"}
MT = {"mode": "multi-turn", "answers": "golden"}
MR = {"mode": "multi-request", "answers": "golden"}


def turns(scores: list[list[float]], tokens: int = 10) -> list[dict]:
    """Rows of conversations: ``scores[t][i]`` is sample ``c<i>``'s score at turn ``t + 1``."""
    out = []
    for t, per in enumerate(scores, start=1):
        out += rows(per, task="turns.kv", ids=[f"c{i}" for i in range(len(per))],
                    extra=lambda i, t=t: {"turn": t, "turns": len(scores), "prediction": f"p{i}t{t}",
                                          "references": [f"gold{i}t{t}"], "generated_tokens": tokens + i})
    return out


def cell(policy, budget, scores, **kw):
    return FakeCell(policy, budget, task="turns.kv", rows=turns(scores, kw.pop("tokens", 10)),
                    conversation=kw.pop("conversation", MT), **kw)


@pytest.fixture
def report(store):
    idx, res = store
    store_run(idx, res, "r1", [
        cell("full", None, [[1, 1], [1, 1], [1, 1]]),
        cell("keydiff", 64, [[1, 1], [1, 0], [0, 0]], tokens=12),
        cell("keydiff", 64, [[1, 0], [1, 1], [1, 1]], protocol=CTX),
        cell("full", None, [[1, 0], [1, 0], [1, 0]], conversation=MR),
        cell("keydiff", 64, [[1, 0], [0, 0], [1, 0]], conversation=MR),
    ])
    return build_report(idx, ["r1"], ReportOptions(resamples=200))


def test_score_by_turn_against_the_full_cache_and_turn_1(report):
    by = {(r.policy, r.task, r.turn): r for r in report.turns}
    kd = [by[("keydiff", "turns.kv@1024#s0", t)] for t in (1, 2, 3)]
    assert [(r.value, r.delta, r.decay) for r in kd] == [(100.0, 0.0, 0.0), (50.0, -50.0, -50.0),
                                                         (0.0, -100.0, -100.0)]
    assert kd[2].ci_low == kd[2].ci_high == -100.0 and kd[1].ci_low <= -50.0 <= kd[1].ci_high
    # a multi-request cell pairs with the full cache's multi-request cell, never with the multi-turn one
    mr = by[("keydiff", "turns.kv@1024#s0 [multi-request]", 2)]
    assert (mr.value, mr.ref_value, mr.delta, mr.decay) == (0.0, 50.0, -50.0, -50.0)
    assert by[("full", "turns.kv@1024#s0", 1)].note == "reference"
    [agnostic] = [r for r in report.scores if r.policy == "keydiff [query-agnostic]" and r.metric == "turns.kv"]
    assert agnostic.n == 6  # the six (sample, turn) rows, paired with the full cache's turn by turn


def test_query_dependence_by_turn(report):
    rows_ = {r.setting: r for r in report.query_dependence_by_turn if r.task == "turns.kv"}
    assert [(rows_[f"B=64, turn {t}"].a_value, rows_[f"B=64, turn {t}"].b_value, rows_[f"B=64, turn {t}"].delta)
            for t in (1, 2, 3)] == [(100.0, 50.0, 50.0), (50.0, 100.0, -50.0), (0.0, 100.0, -100.0)]


def test_what_compression_broke_and_answer_length(report):
    broken = {(r.policy, r.task, r.id, r.turn): r for r in report.broken}
    assert set(broken) == {("keydiff", "turns.kv@1024#s0", "c1", 2), ("keydiff", "turns.kv@1024#s0", "c0", 3),
                           ("keydiff", "turns.kv@1024#s0", "c1", 3),
                           ("keydiff [query-agnostic]", "turns.kv@1024#s0", "c1", 1),
                           ("keydiff", "turns.kv@1024#s0 [multi-request]", "c0", 2)}
    r = broken[("keydiff", "turns.kv@1024#s0", "c1", 2)]
    assert (r.score, r.ref_score, r.prediction, r.ref_prediction, r.gold) == (0.0, 1.0, "p1t2", "p1t2", "gold1t2")
    length = {(r.policy, r.task): r for r in report.answer_length}
    kd = length[("keydiff", "turns.kv@1024#s0")]
    assert (kd.n_paired, kd.tokens, kd.ref_tokens, kd.delta, kd.ci_low, kd.ci_high) == (6, 12.5, 10.5, 2.0, 2.0, 2.0)
    assert length[("keydiff [query-agnostic]", "turns.kv@1024#s0")].delta == 0.0


def test_outputs_carry_the_tables_and_the_figure(report, tmp_path):
    import typer

    from kdeval.cli import report_cmds

    app = typer.Typer()
    report_cmds.register(app)
    app.command("noop")(lambda: None)  # a second command: the app keeps its subcommand names
    back = from_json(to_json(report))
    assert back.turns == report.turns and back.broken == report.broken
    assert back.answer_length == report.answer_length
    md = to_markdown(report)
    for section in ("## Conversations by turn", "## What compression broke", "## Answer length",
                    "query dependence by turn"):
        assert section in md
    titles = [p.title for p in turn_plots(report)]
    assert [t for t in titles if "turns.kv@1024#s0," in t] == [  # one figure per protocol, the full cache in each
        "score by turn — m, B=64, turns.kv@1024#s0, query-aware",
        "score by turn — m, B=64, turns.kv@1024#s0, query-agnostic"]
    assert all(p.png.startswith(b"\x89PNG") for p in turn_plots(report))
    res = CliRunner().invoke(app, ["report", "r1", "--db", str(tmp_path / "index.sqlite"), "--broken"],
                             terminal_width=250)
    assert res.exit_code == 0, res.output
    assert "what compression broke" in res.output and "gold1t2" in res.output
    assert res.output.count("keydiff") == 5


def test_exports_carry_the_turn(store, tmp_path):
    from kdeval.jobs.interop.export import run_table
    from kdeval.jobs.interop.export_dir import export_dir

    idx, res = store
    store_run(idx, res, "r2", [cell("keydiff", 64, [[1, 1], [0, 1]]),
                               cell("keydiff", 64, [[1, 1], [1, 1]], conversation=MR)])
    table = run_table(idx, "r2").table
    assert sorted(zip(table.column("id").to_pylist(), table.column("turn").to_pylist())) == [
        ("c0", 1), ("c0", 1), ("c0", 2), ("c0", 2), ("c1", 1), ("c1", 1), ("c1", 2), ("c1", 2)]
    export_dir(idx, "r2", "lm-eval", tmp_path / "lm")
    docs = [json.loads(line)["doc"] for f in (tmp_path / "lm").rglob("samples_*.jsonl") for line in f.open()]
    assert sorted((d["id"], d["turn"]) for d in docs) == [("c0", 1), ("c0", 1), ("c0", 2), ("c0", 2), ("c1", 1),
                                                          ("c1", 1), ("c1", 2), ("c1", 2)]
    export_dir(idx, "r2", "kvpress", tmp_path / "kv")
    dirs = sorted(p.parent.name for p in (tmp_path / "kv").rglob("predictions.csv"))
    assert len(dirs) == 2 and any("multi_request" in d for d in dirs), dirs
