"""Simulated nights end to end through `kdeval nightly`: a changed environment recomputes and is named, a
weakened policy fails the gate and is named, a slow drift is flagged while every night passes, noise-only
nights pass, on_fail runs with the gate's file, the history page is written.

Cells run in this process (tests/support/nightly_probe.py): their scores come from each policy's own rule on
synthetic keys, their provenance from the worker's provenance function, which the tests replace to play a
changed stack (as they replace the night's environment)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.storage import RunIndex
from tests.support.nightly_probe import InProcessExecutor, ProbeWorkload, WeakenablePolicy, run_here, use_weakenable

GRID = """
name: nights
models: ["stub:0"]
policies: [POLICIES]
budgets: [16]
chunk_sizes: [32]
tasks: [{name: ruler.niah_single_1, lengths: [256, 512], samples: 30}]
nightly:
  report_dir: REPORTS
  resamples: 400
  formats: [json, md]
  drift: {nights: 3, max_drop: 2.0}
  tracked:
    - {metric: "*", max_drop: 8.0}
"""
ENV = {"kdeval_version": "0.1.0", "source_hash": "aaaa", "git_commit": None, "torch": "2.13.0",
       "transformers": "4.57.0", "cuda": None, "driver": None, "device": "cpu x86_64", "python": "3.12.0"}


class Nights:
    """Runs nights of one nightly file through the CLI, with the stack (workload, environment) the test sets."""

    def __init__(self, tmp: Path, monkeypatch, policies: str = "full, keydiff", extra: str = "") -> None:
        self.tmp, self.mp = tmp, monkeypatch
        self.file = tmp / "nightly.yaml"
        self.file.write_text(GRID.replace("POLICIES", policies).replace("REPORTS", str(tmp / "reports")) + extra)
        self.db, self.results = str(tmp / "index.sqlite"), str(tmp / "results")
        self.workload = ProbeWorkload()
        self.env = dict(ENV)
        self.executor = InProcessExecutor(self.workload)
        monkeypatch.setattr("kdeval.jobs.run.service.execute_run", self.executor)
        monkeypatch.setattr("kdeval.jobs.nightly.run.night_environment", lambda: dict(self.env))
        real = __import__("kdeval.cluster.provenance", fromlist=["collect_provenance"]).collect_provenance
        monkeypatch.setattr("kdeval.cluster.provenance.collect_provenance",
                            lambda task, handle=None: {**real(task, handle), "torch": self.env["torch"],
                                                       "device": self.env["device"]})

    def run(self, *args: str):
        self.executor.computed.clear()
        res = CliRunner().invoke(app, ["nightly", str(self.file), "--db", self.db, "--results-dir", self.results,
                                       "--json", *args])
        assert res.exit_code in (0, 1), res.output
        return res.exit_code, json.loads(res.output)

    def gate(self, summary) -> dict:
        return json.loads((self.tmp / "reports" / summary["run"] / "gate.json").read_text())


def _files(results: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(results).rglob("*.parquet")}


def test_each_night_recomputes_and_keeps_the_nights_before(tmp_path, monkeypatch):
    nights = Nights(tmp_path, monkeypatch)
    code, first = nights.run()
    assert code == 0 and len(nights.executor.computed) == 4  # full and keydiff at two lengths
    before = _files(nights.results)
    code, second = nights.run()
    assert code == 0 and len(nights.executor.computed) == 4 and second["baseline"] == first["run"]
    after = _files(nights.results)
    assert len(after) == 2 * len(before) and all(after[k] == v for k, v in before.items())  # nothing overwritten
    idx = RunIndex.open(nights.db)
    ids = [{c.id for c in idx.run_cells(s["run"])} for s in (first, second)]
    assert not ids[0] & ids[1]


def test_a_resumed_night_reuses_what_it_finished(tmp_path, monkeypatch):
    nights = Nights(tmp_path, monkeypatch)

    def crash_after_one(index, run_id, address=None, **kw):
        run_here(nights.workload, index, run_id, index.run_cells(run_id)[0])
        raise KeyboardInterrupt  # the driver died: the run stays unfinished
    monkeypatch.setattr("kdeval.jobs.run.service.execute_run", crash_after_one)
    res = CliRunner().invoke(app, ["nightly", str(nights.file), "--db", nights.db, "--results-dir", nights.results])
    assert res.exit_code != 0
    monkeypatch.setattr("kdeval.jobs.run.service.execute_run", nights.executor)
    code, summary = nights.run()
    assert code == 0 and len(nights.executor.computed) == 3  # the first cell was done before the crash
    assert len(RunIndex.open(nights.db).run_cells(summary["run"])) == 4


def test_changed_environment_recomputes_and_is_named(tmp_path, monkeypatch):
    nights = Nights(tmp_path, monkeypatch, extra="  reuse: unchanged\n")
    code, first = nights.run()
    assert code == 0 and len(nights.executor.computed) == 4
    code, second = nights.run()  # same stack: every cell reused
    assert code == 0 and nights.executor.computed == []
    kept = _files(nights.results)
    # the new torch changes the numbers: the needle stands out less
    nights.env["torch"] = "2.99.0"
    nights.workload.strength = 0.6
    code, third = nights.run()
    assert code == 1 and len(nights.executor.computed) == 4
    assert all(_files(nights.results)[k] == v for k, v in kept.items())
    gate = nights.gate(third)
    changes = {c["what"]: (c["baseline"], c["tonight"]) for c in gate["attribution"]["changes"]}
    assert changes["night torch"] == ("2.13.0", "2.99.0") and changes["cells' torch"] == ("2.13.0", "2.99.0")
    [reg] = [r for r in gate["attribution"]["regressions"] if r["metric"] == "ruler.niah_single_1"]
    assert reg["policy"] == "keydiff" and reg["delta"] < -8 and reg["ci_high"] < -8
    assert [c["task"] for c in reg["cells"]] and sum(c["points"] for c in reg["cells"]) == pytest.approx(reg["delta"])
    report = (tmp_path / "reports" / third["run"] / "report.md").read_text()
    assert "- note: changed since the baseline night: night torch: 2.13.0 → 2.99.0" in report
    assert "- note: driven by: keydiff N=16 B=32 ruler.niah_single_1@" in report


def test_weakened_policy_fails_the_gate_and_is_named(tmp_path, monkeypatch):
    use_weakenable(monkeypatch)
    nights = Nights(tmp_path, monkeypatch, policies=f"full, keydiff, {WeakenablePolicy.name}")
    code, first = nights.run()
    assert code == 0
    monkeypatch.setattr(WeakenablePolicy, "weakened", True)
    code, second = nights.run()
    assert code == 1 and not second["passed"]
    gate = nights.gate(second)
    blamed = {r["policy"] for r in gate["attribution"]["regressions"]}
    assert blamed == {WeakenablePolicy.name}  # keydiff itself did not move
    reg = next(r for r in gate["attribution"]["regressions"] if r["metric"] == "ruler.niah_single_1")
    cells = reg["cells"]
    assert {c["task"] for c in cells} == {"ruler.niah_single_1@256#s0", "ruler.niah_single_1@512#s0"}
    assert cells[0]["points"] <= cells[1]["points"] < 0  # ranked, most negative first
    assert all(c["policy"] == WeakenablePolicy.name for c in cells)
    attribution = (tmp_path / "reports" / second["run"] / "attribution.md").read_text()
    assert WeakenablePolicy.name in attribution and "Nothing recorded changed" in attribution


def test_slow_drift_is_flagged_while_every_night_passes(tmp_path, monkeypatch):
    nights = Nights(tmp_path, monkeypatch)
    summaries = []
    for strength in (1.0, 0.97, 0.94, 0.91, 0.88, 0.85):
        nights.workload.strength = strength
        code, summary = nights.run()
        assert code == 0, summary
        summaries.append(summary)
    [drift] = [d for d in summaries[-1]["drift"] if d["series"][4] == "ruler.niah_single_1"]
    assert drift["series"][1] == "keydiff" and drift["ci_high"] < -2.0
    assert drift["runs"] == [s["run"] for s in summaries]
    page = (tmp_path / "reports" / "history.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 and "DRIFT" in page


def test_noise_only_nights_pass_and_on_fail_is_not_run(tmp_path, monkeypatch):
    marker = tmp_path / "called"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    nights = Nights(tmp_path, monkeypatch, extra=f"  on_fail: \"{sys.executable} {script}\"\n")
    nights.workload.jitter = 0.2
    for seed in range(6):
        nights.workload.night_seed = seed
        code, summary = nights.run()
        assert code == 0 and summary["passed"] and not summary["drift"], summary
    assert not marker.exists()


def test_on_fail_runs_with_the_gate_file_and_its_failure_keeps_the_verdict(tmp_path, monkeypatch):
    copy = tmp_path / "posted.json"
    script = tmp_path / "post.py"
    script.write_text("import shutil, sys\nshutil.copy(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "
                      f"{str(copy)!r})\n")
    nights = Nights(tmp_path, monkeypatch, extra=f"  on_fail: \"{sys.executable} {script}\"\n")
    nights.run()
    nights.workload.strength = 0.5
    code, failed = nights.run()
    assert code == 1 and failed["on_fail"]["ok"]
    posted = json.loads(copy.read_text())
    assert posted["run"] == failed["run"] and posted["passed"] is False and posted["regressions"]
    # a hook that fails: reported, and the verdict (and exit code) stay those of the gate
    nights.file.write_text(nights.file.read_text().replace(str(script), str(tmp_path / "missing.py")))
    code, again = nights.run()
    assert code == 1 and not again["on_fail"]["ok"] and "status" in again["on_fail"]["error"]
    res = CliRunner().invoke(app, ["nightly", "history", str(nights.file), "--out", str(tmp_path / "page")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "page" / "history.html").read_text()
    assert page.count("<tr>") == 1 + 3 and "FAIL" in page and "PASS" in page


def test_salt_gives_a_new_storage_id_and_keeps_the_result_identity(tmp_path):
    from kdeval.jobs.grid.cells import CellSpec, expand, expand_grid
    from kdeval.jobs.nightly.spec import parse_nightly

    grid = parse_nightly(GRID.replace("POLICIES", "full, keydiff").replace("REPORTS", str(tmp_path))).grid
    plain = expand(grid)
    salted = expand_grid(grid, salt=lambda c: "night n1").cells
    assert [c.result_id for c in salted] == [c.id for c in plain] == [c.result_id for c in plain]
    assert not {c.id for c in salted} & {c.id for c in plain}
    again = CellSpec.model_validate(salted[0].record().spec)  # what a resume reads back from the index
    assert again.id == salted[0].id and again.salt == "night n1"


def test_on_fail_past_its_timeout_is_killed_with_everything_it_started(tmp_path):
    """A hook that backgrounds a child and hangs: the gate returns at its timeout, and the child is dead too
    (it held the hook's output pipes: waiting for them kept the gate until the child ended)."""
    import os
    import time

    from kdeval.jobs.nightly.notify import run_on_fail

    pidfile = tmp_path / "child.pid"
    command = f"sh -c 'sleep 41 & echo $! > {pidfile}; exec sleep 1000'"
    t0 = time.monotonic()
    got = run_on_fail(command, tmp_path / "gate.json", timeout_s=2.0)
    took = time.monotonic() - t0
    assert not got["ok"] and got["error"].startswith("timed out after 2s"), got
    assert took < 8, took
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
            with open(f"/proc/{child}/stat") as fh:  # killed but not reaped by init: a zombie is gone
                if fh.read().rpartition(")")[2].split()[0] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError(f"on_fail's background child {child} outlived the gate")
