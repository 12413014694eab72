"""The nightly history page: drawn from history entries alone, it names what changed from night to night,
marks the failing and drifting nights, and opens in headless Chromium with every figure decoded."""
from __future__ import annotations

import numpy as np
import pytest

from kdeval.jobs.nightly.history_page import changes, history_html, write_history_page
from tests.jobs.reports.test_html_browser import CHROMIUM, IMAGE_PROBE, _chromium

ENV = {"kdeval_version": "0.1.0", "source_hash": "aaaa", "git_commit": "0123456789abcdef", "torch": "2.13.0",
       "transformers": "4.57.0", "cuda": None, "driver": None, "device": "cpu x86_64", "python": "3.12.0"}


def _night(i: int, value: float, *, passed: bool = True, drift: bool = False, **env) -> dict:
    key = "needle · keydiff N=64 B=32 · m"
    return {"run": f"run-{i}", "time": f"2026-11-{10 + i:02d}T02:00:00Z", "grid": "g", "grid_hash": "h1",
            "baseline": f"run-{i - 1}" if i else None, "passed": passed,
            "regressions": [] if passed else ["needle keydiff N=64 B=32 (m): dropped 20.00 points"],
            "speed_regressions": [], "env": {**ENV, **env}, "data": {"needle@256#s0": "d1"},
            "drift": [{"key": key, "text": "needle keydiff: the last 3 nights average 6 points below"}] if drift else [],
            "tracked": [{"key": key, "value": value, "low": value - 3 if i else None, "high": value + 3 if i else None,
                         "threshold": 85.0 if i else None, "regressed": not passed}],
            "perf": [{"model": "m", "policy": "keydiff", "budget": 64, "chunk": 32, "task": "needle@256#s0",
                      "ttft_s": 0.1 + 0.01 * i, "decode_tok_s": 50.0 - i, "peak_kv_bytes": 4096}]}


def _entries() -> list[dict]:
    return [_night(0, 92.0), _night(1, 91.0), _night(2, 90.0, torch="2.14.0"), _night(3, 70.0, passed=False),
            _night(4, 88.0, drift=True)]


def test_changes_name_what_moved_from_the_night_before():
    e = _entries()
    assert changes(None, e[0]) == ["first night"]
    assert changes(e[0], e[1]) == []
    assert changes(e[1], e[2]) == ["torch: 2.13.0 → 2.14.0"]
    moved = dict(e[2], grid_hash="h2", data={"needle@256#s0": "d2"})
    assert changes(e[2], moved) == ["grid h1 → h2", "data needle@256#s0: d1 → d2"]


def test_page_content():
    page = history_html(_entries(), "kdeval nightly g: history")
    assert "<script" not in page and page.count("data:image/png;base64,") == 2  # one score series + speed/memory
    assert page.count("<tr>") == 1 + 5 and page.index("run-4") < page.index("run-0")  # newest night first
    assert "torch: 2.13.0 → 2.14.0" in page and "dropped 20.00 points" in page and "DRIFT" in page
    assert "0.1.0+aaaa @0123456789" in page


def test_history_page_opens_in_chromium(tmp_path):
    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium)")
    page = write_history_page(_entries(), tmp_path, "kdeval nightly g: history")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</head>", IMAGE_PROBE + "</head>", 1))
    dom, err = _chromium(["--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                          probed.as_uri()])
    assert 'data-images="2"' in dom and 'data-images-ok="2"' in dom
    assert [ln for ln in err.splitlines() if "Uncaught" in ln or "Failed to load" in ln] == []
    shot = tmp_path / "shot.png"
    _chromium([f"--screenshot={shot}", page.as_uri()])
    import matplotlib.image

    img = np.asarray(matplotlib.image.imread(shot))[..., :3]
    assert img.shape[0] > 500 and (img < 0.95).any(axis=-1).mean() > 0.02


def test_cli_history_page_and_its_bad_input(tmp_path):
    from typer.testing import CliRunner

    from kdeval.cli.app import app
    from kdeval.jobs.nightly.run import append_history

    grid = tmp_path / "nightly.yaml"
    grid.write_text(f"""name: g
models: ["stub:0"]
policies: [full]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 3}}]
nightly:
  report_dir: {tmp_path / "reports"}
  tracked: [{{metric: "*", max_drop: 5.0}}]
""")
    for e in _entries() + [dict(_night(9, 50.0), grid="other")]:
        append_history(tmp_path / "reports", e)
    run = CliRunner().invoke
    ok = run(app, ["nightly", "history", str(grid), "--out", str(tmp_path / "page")])
    assert ok.exit_code == 0, ok.output
    page = (tmp_path / "page" / "history.html").read_text()
    assert page.count("<tr>") == 1 + 5 and "run-9" not in page  # this grid's nights only
    assert "id='leaderboard'" not in page  # no nightly has written a leaderboard yet
    (tmp_path / "reports" / "leaderboard.html").write_text("<html></html>")
    assert run(app, ["nightly", "history", str(grid), "--out", str(tmp_path / "page")]).exit_code == 0
    assert "href='../reports/leaderboard.html'" in (tmp_path / "page" / "history.html").read_text()
    no_out = run(app, ["nightly", "history", str(grid)])
    assert no_out.exit_code == 2 and "--out is required" in no_out.output
    no_grid = run(app, ["nightly", "history", "--out", str(tmp_path / "x")])
    assert no_grid.exit_code == 2 and "kdeval nightly history GRID --out DIR" in no_grid.output
    assert not (tmp_path / "x").exists()
    bad = grid.read_text().replace("  tracked:", "  reuse: sometimes\n  tracked:")
    grid.write_text(bad)
    wrong = run(app, ["nightly", "history", str(grid), "--out", str(tmp_path / "y")])
    assert wrong.exit_code == 2 and "nightly.reuse" in wrong.output and not (tmp_path / "y").exists()


def test_history_and_attribution_name_the_same_night_changes():
    from kdeval.jobs.nightly.attribution import differences

    base = {"env": {"torch": "2.4.0", "device": "cpu"}, "grid_hash": "a" * 20, "data": {"math500": "d" * 16}}
    night = {"env": {"torch": "2.5.1", "device": "cpu"}, "grid_hash": "b" * 20, "data": {"math500": "e" * 16, "x": "f"}}
    assert changes(base, night) == ["torch: 2.4.0 → 2.5.1", f"grid {'a' * 12} → {'b' * 12}",
                                    f"data math500: {'d' * 12} → {'e' * 12}", "data x: None → f"]
    assert differences(base, night, [], []) == [
        {"what": "night torch", "baseline": "2.4.0", "tonight": "2.5.1"},
        {"what": "grid hash", "baseline": "a" * 20, "tonight": "b" * 20},
        {"what": "data math500", "baseline": "d" * 16, "tonight": "e" * 16},
        {"what": "data x", "baseline": "None", "tonight": "f"}]
    # a baseline that recorded no environment: the history still lists the facts, the attribution does not
    assert changes({}, {"env": {"torch": "2.5.1"}}) == ["torch: None → 2.5.1"]
    assert differences({}, {"env": {"torch": "2.5.1"}}, [], []) == []
    assert changes(None, night) == ["first night"] and differences(None, night, [], []) == []
