"""The HTML report draws the cost-of-chunking and query-dependence sections: a figure (Δ with CI per row) and a
table each, in headless Chromium; their images decode and the page renders non-blank."""
from __future__ import annotations

import numpy as np
import pytest

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.output import write_report
from tests.jobs.reports.helpers import FakeCell, rows, store_run
from tests.jobs.reports.test_html_browser import CHROMIUM, IMAGE_PROBE, _chromium, _headers

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed "
                                                          "(Debian: apt-get install chromium)")
CTX = {"compress": "context", "decode": "evict"}


@pytest.fixture
def html_file(store, tmp_path):
    idx, res = store
    cells = [FakeCell("full", None, rows=rows([1] * 6)), FakeCell("full", None, chunk=0, rows=rows([1] * 6))]
    for pol, chunked, whole, agnostic in (("keydiff", [1, 0, 1, 1, 0, 1], [1] * 6, [0, 0, 1, 1, 0, 1]),
                                          ("snapkv", [1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 0, 1])):
        cells += [FakeCell(pol, 128, rows=rows(chunked)), FakeCell(pol, 128, chunk=0, rows=rows(whole)),
                  FakeCell(pol, 128, protocol=CTX, rows=rows(agnostic)),
                  FakeCell(pol, 128, chunk=0, protocol=CTX, rows=rows(whole))]
    store_run(idx, res, "r1", cells)
    report = build_report(idx, ["r1"], ReportOptions(resamples=100))
    return write_report(report, tmp_path / "out", ["html"])["html"]


def test_contrast_sections_open_and_draw(html_file, tmp_path):
    probed = tmp_path / "probed.html"
    probed.write_text(html_file.read_text(encoding="utf-8").replace("</head>", IMAGE_PROBE + "</head>", 1),
                      encoding="utf-8")
    dom, _ = _chromium(["--virtual-time-budget=5000", "--dump-dom", probed.as_uri()])
    assert dom.index('data-table="scores"') < dom.index('id="cost_of_chunking"') < dom.index('id="query_dependence"')
    for name in ("cost_of_chunking", "query_dependence"):
        section = dom[dom.index(f'id="{name}"'):]
        assert section.index("<img") < section.index(f'data-table="{name}"')
        assert _headers(section[section.index(f'data-table="{name}"'):]) == [
            "policy", "N", "task", "setting", "a vs b", "n", "a", "b", "Δ [95% CI]", "KV a MiB", "KV b MiB",
            "TTFT a s", "TTFT b s", "note"]
    assert "B=64 vs whole" in dom and "query-aware vs query-agnostic" in dom
    n_images = int(dom.split('data-images="')[1].split('"')[0])
    assert n_images >= 5 and f'data-images-ok="{n_images}"' in dom


def test_contrast_section_screenshot(html_file, tmp_path):
    """A screenshot of the page from the cost-of-chunking section on is not blank (kept next to the page)."""
    text = html_file.read_text(encoding="utf-8")
    body = text.index("<body>") + len("<body>")
    target = html_file.with_name("chunking.html")
    target.write_text(text[:body] + text[text.index('<h2 id="cost_of_chunking"'):], encoding="utf-8")
    shot = html_file.with_name("chunking.png")
    _chromium([f"--screenshot={shot}", target.as_uri()])
    import matplotlib.image

    img = np.asarray(matplotlib.image.imread(shot))[..., :3]
    assert img.shape[0] > 500 and (img < 0.95).any(axis=-1).mean() > 0.02
