"""The HTML report opens in headless Chromium without errors, its plots decode, its tables carry the expected
headers (the headline first), and it renders non-blank at 1400 px.

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.output import write_report
from tests.jobs.reports.helpers import FakeCell, rows, store_run

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed "
                                                          "(Debian: apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1400,1600"]


def _chromium(args: list[str], timeout: float = 60.0) -> tuple[str, str]:
    """Run Chromium with a fresh profile; on timeout kill only the process group it started."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"chromium did not finish in {timeout}s")
    assert proc.returncode == 0, err[-2000:]
    return out, err


@pytest.fixture
def html_file(store, tmp_path) -> Path:
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1, 1, 0, 1, 1, 1], depths=[10.0, 50.0, 90.0])),
        FakeCell("keydiff", 128, rows=rows([1, 0, 0, 1, 1, 1], depths=[10.0, 50.0, 90.0])),
        FakeCell("keydiff", 256, rows=rows([1, 1, 0, 1, 1, 1], depths=[10.0, 50.0, 90.0])),
        FakeCell("sink", 128, rows=None, error="RuntimeError: boom"),
    ])
    report = build_report(idx, ["r1"], ReportOptions(resamples=100))
    return write_report(report, tmp_path / "out", ["html"])["html"]


#: Counts the page's images and those that decoded, as body attributes --dump-dom shows; added to a copy of
#: the report here, so the user's report carries no test code.
IMAGE_PROBE = """<script>
window.addEventListener('load', function () {
  var ok = 0; var imgs = document.images;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  document.body.setAttribute('data-images-ok', String(ok));
  document.body.setAttribute('data-images', String(imgs.length));
});
</script>"""


def test_html_report_opens_without_errors(html_file, tmp_path):
    text = html_file.read_text(encoding="utf-8")
    assert "<script" not in text  # the report itself runs no code
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</head>", IMAGE_PROBE + "</head>", 1), encoding="utf-8")
    dom, err = _chromium(["--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                          probed.as_uri()])
    assert 'data-table="scores"' in dom and 'data-table="cells"' in dom
    # the headline table comes first: policy rows, one column per benchmark headline number
    assert dom.index('class="headline"') < dom.index("<h2>Figures</h2>") < dom.index('data-table="scores"')
    headline = dom[dom.index('class="headline"'):]
    assert _headers(headline) == ["policy", "needle"]
    assert _headers(dom[dom.index('data-table="scores"'):]) == ["policy", "N", "metric", "n", "score", "Δ [95% CI]",
                                                                 "note"]
    assert _headers(dom[dom.index('data-table="perf"'):]) == ["policy", "N", "task", "n", "TTFT s", "TTFT ×",
                                                               "decode tok/s", "tok/s ×", "note"]
    assert "keydiff N=128" in headline and "†" in headline  # 6 paired samples: the CI is marked
    n_images = int(dom.split('data-images="')[1].split('"')[0])
    assert n_images >= 3  # score vs budget, needle heatmap, memory vs length
    assert f'data-images-ok="{n_images}"' in dom  # every inlined PNG decoded
    console = [ln for ln in err.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln]
    assert console == []


def _headers(fragment: str) -> list[str]:
    """The header cells of the first table in ``fragment``."""
    head = fragment[fragment.index("<thead>"): fragment.index("</thead>")]
    return re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", head)


def test_html_report_screenshot_is_not_blank(html_file, tmp_path):
    shot = tmp_path / "shot.png"
    _chromium([f"--screenshot={shot}", html_file.as_uri()])
    import matplotlib.image

    img = np.asarray(matplotlib.image.imread(shot))[..., :3]
    non_white = (img < 0.95).any(axis=-1).mean()
    assert img.shape[0] > 500 and non_white > 0.02 and img.std() > 0.05
