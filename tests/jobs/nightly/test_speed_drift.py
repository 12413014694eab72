"""The nightly's speed and memory gates (CI-aware ratios, exact KV bytes) and its change-point rule's known
answers."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from kdeval.jobs.nightly.drift import window_test
from kdeval.jobs.nightly.gate import GateResult, gate
from kdeval.jobs.nightly.spec import NightlySpec, TrackedMetric, parse_nightly
from kdeval.jobs.nightly.speed import speed_gate
from kdeval.jobs.reports import ReportOptions, build_report
from tests.jobs.reports.helpers import FakeCell, rows, store_run


def _timed(ttft, kv=256 * 1024, batch=True):
    return lambda i: {"ttft_s": ttft[i % len(ttft)], "peak_kv_bytes": kv, "timing_batch": i if batch else None}


BASE = [0.2 + 0.01 * i for i in range(12)]


def _report(store, after_kd, after_sink, after_one):
    idx, res = store
    store_run(idx, res, "before", [
        FakeCell("keydiff", 256, rows=rows([1.0] * 12, extra=_timed(BASE))),
        FakeCell("sink", 256, rows=rows([1.0] * 12, extra=_timed(BASE))),
        FakeCell("snapkv", 256, rows=rows([1.0] * 4, extra=_timed([0.3], batch=False)))], version="v1")
    store_run(idx, res, "after", [
        FakeCell("keydiff", 256, rows=rows([1.0] * 12, extra=after_kd)),
        FakeCell("sink", 256, rows=rows([1.0] * 12, extra=after_sink)),
        FakeCell("snapkv", 256, rows=rows([1.0] * 4, extra=after_one))], version="v2")
    return build_report(idx, ["after"], ReportOptions(compare="before", resamples=500))


TRACKED = [TrackedMetric(policy="*", max_drop=5.0, max_ttft_ratio=1.5, min_decode_ratio=0.8,
                            max_kv_bytes_ratio=1.0)]


def test_speed_and_memory_gates(store):
    rep = _report(store,
                  after_kd=_timed([2 * t for t in BASE], kv=257 * 1024),                          # 2x slower, +1 KiB
                  after_sink=_timed([t * (3.0 if i % 2 else 0.4) for i, t in enumerate(BASE)]),  # noise
                  after_one=_timed([0.9], batch=False))                                          # 3x, one timing
    checked, found = speed_gate(rep, TRACKED)
    assert sorted((f.row.policy, f.what) for f in found) == [("keydiff", "TTFT"), ("keydiff", "peak KV bytes")]
    ttft = next(f for f in found if f.what == "TTFT")
    assert (ttft.ratio, ttft.low) == (2.0, 2.0) and "× 2.000 of the baseline" in ttft.describe()
    kv = next(f for f in found if f.what == "peak KV bytes")
    assert kv.ratio == pytest.approx(257 / 256) and "exact" in kv.describe()
    # keydiff and sink: TTFT, decode, KV; snapkv (one batch timing): KV only
    assert checked == 7
    assert speed_gate(rep, [TrackedMetric(max_drop=5.0)]) == (0, [])  # not opted in: nothing checked


def test_speed_gates_fail_the_night(store):
    rep = _report(store, after_kd=_timed(BASE, kv=512 * 1024), after_sink=_timed(BASE), after_one=_timed([0.3]))
    spec = NightlySpec(tracked=TRACKED, resamples=200)
    result = gate(rep, spec)
    _, speed = speed_gate(rep, spec.tracked)
    assert result.passed and not GateResult(checked=1, speed=speed).passed


def test_window_test_known_answers():
    before = np.array([[1, 0, 1, 1, 0, 1, 1, 1]] * 3, dtype=float)
    iv, flagged = window_test(before.copy(), before, None, 2.0, resamples=200, seed=0, confidence=0.95)
    assert (iv.estimate, iv.low, iv.high, flagged) == (0.0, 0.0, 0.0, False)
    recent = before.copy()
    recent[:, :2] = 0.0  # one sample of 8 lost every night: -12.5 points
    iv, flagged = window_test(recent, before, None, 2.0, resamples=200, seed=0, confidence=0.95)
    assert iv.estimate == pytest.approx(-12.5) and not flagged  # its CI reaches 0: one sample is not a drift
    recent[:, :] = 0.0
    iv, flagged = window_test(recent, before, None, 2.0, resamples=200, seed=0, confidence=0.95)
    assert iv.estimate == pytest.approx(-75.0) and iv.high < -2.0 and flagged


def test_nightly_section_bad_input():
    from tests.jobs.nightly.test_gate import NIGHTLY

    with pytest.raises(ValueError, match=r"nightly\.on_fail: .*No closing quotation"):
        parse_nightly(NIGHTLY + "  on_fail: \"notify 'oops\"\n")
    with pytest.raises(ValueError, match=r"nightly\.on_fail: .*only spaces"):
        parse_nightly(NIGHTLY + "  on_fail: '   '\n")
    with pytest.raises(ValueError, match=r"nightly\.tracked\[0\]\.max_ttft_ratio"):
        parse_nightly(NIGHTLY.replace("max_drop: 5.0}", "max_drop: 5.0, max_ttft_ratio: 0}"))
    with pytest.raises(ValueError, match=r"nightly\.drift\.nights"):
        parse_nightly(NIGHTLY + "  drift: {nights: 0}\n")
    nf = parse_nightly(NIGHTLY + "  on_fail: post --to 'team chat'\n  reuse: unchanged\n")
    assert nf.spec.on_fail == "post --to 'team chat'" and nf.spec.reuse == "unchanged"


def test_on_fail_command_outcomes(tmp_path):
    from kdeval.jobs.nightly.notify import run_on_fail

    gate = tmp_path / "gate.json"
    gate.write_text("{}")
    ok = run_on_fail(f"{sys.executable} -c 'import sys; print(open(sys.argv[1]).read())'", gate, 30)
    assert ok["ok"] and ok["output"].strip() == "{}" and ok["command"][-1] == str(gate)
    missing = run_on_fail("no-such-program-here --x", gate, 30)
    assert not missing["ok"] and "could not run 'no-such-program-here'" in missing["error"]
    slow = run_on_fail(f"{sys.executable} -c 'import time; time.sleep(5)'", gate, 0.5)
    assert not slow["ok"] and slow["error"] == "timed out after 0.5s (its process group was killed)"
    shell = run_on_fail("echo $HOME; touch " + str(tmp_path / "pwned"), gate, 30)
    assert shell["ok"] and "$HOME;" in shell["output"] and not (tmp_path / "pwned").exists()  # no shell


def test_a_ttft_gate_with_shared_execution_is_refused():
    """Shared execution times each cell's first samples only: a TTFT gate would rest on one timing and never fire."""
    from tests.jobs.nightly.test_gate import NIGHTLY

    text = NIGHTLY.replace("max_drop: 5.0}", "max_drop: 5.0, max_ttft_ratio: 1.25}")
    with pytest.raises(ValueError, match=r"nightly\.tracked\[0\]\.max_ttft_ratio: a TTFT gate needs every sample"):
        parse_nightly(text)
    assert parse_nightly(text + "\nexecution: {share: false}\n").spec.tracked[0].max_ttft_ratio == 1.25
