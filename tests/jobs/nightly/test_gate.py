"""The nightly gate: passes on equal runs, fails on a planted drop beyond the threshold (CI-aware),
parses its section, resumes/creates runs, writes the report and the history either way."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.grid.cells import grid_hash
from kdeval.jobs.nightly.gate import gate, threshold_for
from kdeval.jobs.nightly.run import run_nightly
from kdeval.jobs.nightly.spec import NightlySpec, TrackedMetric, load_nightly, parse_nightly
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.storage import RunIndex, RunState
from tests.jobs.reports.helpers import FakeCell, record_done, rows, store_run

SPEC = NightlySpec(tracked=[TrackedMetric(metric="needle", max_drop=5.0)], resamples=1000)
GOOD = [1.0] * 20


def _two_runs(store, after_scores, before_scores=GOOD, tag=""):
    idx, res = store
    store_run(idx, res, f"before{tag}", [FakeCell("full", None, rows=rows(GOOD)),
                                         FakeCell("keydiff", 256, rows=rows(before_scores))], version=f"v1{tag}")
    store_run(idx, res, f"after{tag}", [FakeCell("full", None, rows=rows(GOOD)),
                                        FakeCell("keydiff", 256, rows=rows(after_scores))], version=f"v2{tag}")
    return build_report(idx, [f"after{tag}"], ReportOptions(compare=f"before{tag}", resamples=1000))


def test_gate_passes_on_equal_runs(store):
    result = gate(_two_runs(store, GOOD), SPEC)
    assert result.passed and result.checked == 2 and result.regressions == []


def test_gate_fails_on_planted_drop_beyond_threshold(store):
    result = gate(_two_runs(store, [0.0] * 6 + [1.0] * 14), SPEC)  # drop 30 points
    assert not result.passed
    [f] = result.regressions
    assert f.row.policy == "keydiff" and f.drop == pytest.approx(30.0) and f.drop_ci[0] > 5.0
    assert "dropped 30.00 points" in f.describe()


def test_gate_ignores_drops_within_threshold_or_noise(store):
    small = gate(_two_runs(store, [0.0] + [1.0] * 19), SPEC)  # -5 points: not more than 5
    assert small.passed
    spec = NightlySpec(tracked=[TrackedMetric(metric="needle", max_drop=3.0)], resamples=1000)
    # 2 of 20 lost: a 10-point drop > 3, but its CI reaches 0, so the CI's lower bound of the drop is not > 3
    noisy = _two_runs(store, [0.0, 0.0] + [1.0] * 18, tag="-2")
    row = next(r for r in noisy.scores if r.policy == "keydiff" and r.level == "task")
    assert row.delta == pytest.approx(-10.0) and row.ci_high > -3.0
    assert gate(noisy, spec).passed


def test_gate_fails_on_incomplete_cells(store):
    idx, res = store
    store_run(idx, res, "before", [FakeCell("full", None, rows=rows(GOOD))], version="v1")
    store_run(idx, res, "after", [FakeCell("full", None, rows=None, error="boom")], version="v2")
    rep = build_report(idx, ["after"], ReportOptions(compare="before", resamples=100))
    result = gate(rep, SPEC)
    assert not result.passed and [c.state for c in result.failed_cells] == ["failed"]


NIGHTLY = """
name: nightly-test
models: ["stub:0"]
policies: [full, keydiff]
budgets: [64]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 20}]
nightly:
  report_dir: REPORTS
  resamples: 500
  formats: [json, html]
  tracked:
    - {metric: needle, policy: keydiff, max_drop: 5.0}
"""


def test_parse_nightly_section_and_errors(tmp_path):
    nf = parse_nightly(NIGHTLY)
    assert nf.grid.name == "nightly-test" and nf.spec.tracked[0].max_drop == 5.0
    assert "nightly:" not in nf.grid_text and "max_drop" not in nf.grid_text
    with pytest.raises(ValueError, match=r"nightly\.tracked\[0\]\.max_drop"):
        parse_nightly(NIGHTLY.replace("max_drop: 5.0", "max_drop: -1"))
    with pytest.raises(ValueError, match=r"nightly\.treshold"):
        parse_nightly(NIGHTLY + "  treshold: 3\n")
    with pytest.raises(ValueError, match="nightly: section is missing"):
        parse_nightly(NIGHTLY.split("nightly:\n")[0])
    with pytest.raises(ValueError, match="policies"):
        parse_nightly(NIGHTLY.replace("[full, keydiff]", "[full, keydif]"))


def _fake_executor(score_of):
    """Runs a run's cells without Ray: rows with score ``score_of(policy, i)`` written through storage."""
    calls = []

    def execute(index: RunIndex, run_id: str, address=None):
        calls.append(run_id)
        run = index.get_run(run_id)
        for cell in index.run_cells(run_id):
            if cell.state == "done":
                continue
            record_done(index, run_id, cell.id, run.results_dir, rows([score_of(cell.policy, i) for i in range(20)]))
        index.set_run_state(run_id, RunState.DONE)
    execute.calls = calls
    return execute


def _code_version(monkeypatch, version: str) -> None:
    """Pretend the code changed: cells get new ids (each policy's code version enters its cells' ids)."""
    monkeypatch.setattr("kdeval.jobs.grid.cells.kdeval_version", lambda: version)
    monkeypatch.setattr("kdeval.jobs.grid.cells.cell_code_version", lambda policy, params=None, stub=False: version)


def test_run_nightly_end_to_end_baseline_and_regression(tmp_path, monkeypatch):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    nf = parse_nightly(NIGHTLY.replace("REPORTS", str(tmp_path / "reports")))
    _code_version(monkeypatch, "night1")
    first = run_nightly(idx, nf, results_dir=tmp_path / "results", execute=_fake_executor(lambda p, i: 1.0))
    assert first.gate.passed and first.gate.baseline is None and first.exit_code == 0
    assert (first.report_dir / "report.html").is_file() and (first.report_dir / "gate.json").is_file()
    # night 2: a new code version (new cell ids) whose keydiff lost 8 of 20 needles
    _code_version(monkeypatch, "night2")
    ex = _fake_executor(lambda p, i: 0.0 if p == "keydiff" and i < 8 else 1.0)
    second = run_nightly(idx, nf, results_dir=tmp_path / "results", execute=ex)
    assert second.gate.baseline == first.run and not second.gate.passed and second.exit_code == 1
    assert [f.row.policy for f in second.gate.regressions] == ["keydiff"]
    assert (second.report_dir / "vs-full" / "report.json").is_file()
    # night 3: fixed; the baseline is still night 1 (night 2 failed the gate)
    _code_version(monkeypatch, "night3")
    third = run_nightly(idx, nf, results_dir=tmp_path / "results", execute=_fake_executor(lambda p, i: 1.0))
    assert third.gate.baseline == first.run and third.gate.passed
    history = [json.loads(x) for x in (tmp_path / "reports" / "history.jsonl").read_text().splitlines()]
    assert [h["passed"] for h in history] == [True, False, True]
    # the leaderboard beside the history: every night's cells (three code versions, never merged), linked
    board = (tmp_path / "reports" / "leaderboard.html").read_text()
    assert third.files["leaderboard"] == tmp_path / "reports" / "leaderboard.html"
    assert board.count('data-row="') == 3 * len(first.report.perf) and "night2" in board
    assert "<a id='leaderboard' href='leaderboard.html'>" in (tmp_path / "reports" / "history.html").read_text()


def test_run_nightly_resumes_an_unfinished_run(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    nf = parse_nightly(NIGHTLY.replace("REPORTS", str(tmp_path / "reports")))

    def crash(index, run_id, address=None):
        raise KeyboardInterrupt  # the driver died mid-run: the run stays pending/running
    with pytest.raises(KeyboardInterrupt):
        run_nightly(idx, nf, results_dir=tmp_path / "results", execute=crash)
    [(crashed, _)] = idx.runs_of_grid(grid_hash(nf.grid))
    ex = _fake_executor(lambda p, i: 1.0)
    outcome = run_nightly(idx, nf, results_dir=tmp_path / "results", execute=ex)
    assert outcome.resumed and outcome.run == crashed and ex.calls == [crashed]


def test_cli_nightly_gates_an_existing_run(store, tmp_path):
    idx, res = store
    store_run(idx, res, "before", [FakeCell("full", None, rows=rows(GOOD)),
                                   FakeCell("keydiff", 64, chunk=32, rows=rows(GOOD))], version="v1")
    store_run(idx, res, "after", [FakeCell("full", None, rows=rows(GOOD)),
                                  FakeCell("keydiff", 64, chunk=32, rows=rows([0.0] * 10 + [1.0] * 10))], version="v2")
    path = tmp_path / "nightly.yaml"
    path.write_text(NIGHTLY.replace("REPORTS", str(tmp_path / "reports")))
    db = str(idx.engine.url)
    res1 = CliRunner().invoke(app, ["nightly", str(path), "--db", db, "--run", "after", "--baseline", "before"])
    assert res1.exit_code == 1, res1.output
    assert "REGRESSION" in res1.output and "FAIL" in res1.output
    assert (tmp_path / "reports" / "after" / "report.html").is_file()
    res2 = CliRunner().invoke(app, ["nightly", str(path), "--db", db, "--run", "before", "--baseline", "before"])
    assert res2.exit_code == 0, res2.output  # a run against itself: no baseline comparison, no failures
    bad = CliRunner().invoke(app, ["nightly", str(tmp_path / "missing.yaml"), "--db", db])
    assert bad.exit_code == 2
    nowhere = tmp_path / "typo.sqlite"
    gone = CliRunner().invoke(app, ["nightly", str(path), "--db", str(nowhere), "--run", "after"])
    assert gone.exit_code == 2 and "no index at" in gone.output and not nowhere.exists(), gone.output


def test_example_nightly_file_is_valid():
    from pathlib import Path

    nf = load_nightly(Path(__file__).resolve().parents[3] / "examples" / "nightly.yaml")
    assert nf.spec.baseline == "last" and len(nf.spec.tracked) == 3
    assert threshold_for(_metric("needle", "keydiff"), nf.spec.tracked) == 5.0
    assert threshold_for(_metric("ruler.avg", "snapkv"), nf.spec.tracked) == 5.0
    assert threshold_for(_metric("needle", "snapkv"), nf.spec.tracked) == 10.0


def _metric(metric, policy):
    from kdeval.jobs.reports import MetricRow

    return MetricRow(level="task", benchmark="x", metric=metric, model="m", policy=policy, budget=1, chunk=1)
