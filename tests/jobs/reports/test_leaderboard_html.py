"""The leaderboard's HTML page: self-contained, one row per cell with its raw row, figures per task; in headless
Chromium its headers sort the rows and its search box filters them (skipped without Chromium)."""
from __future__ import annotations

import json
import re

import pytest

from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard
from kdeval.jobs.reports.leaderboard.cells import Filters
from kdeval.jobs.reports.leaderboard.html import render_page
from tests.jobs.reports.helpers import FakeCell, rows, store_run
from tests.jobs.reports.test_html_browser import CHROMIUM, _chromium


@pytest.fixture
def page(store, tmp_path):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 6)),
                               FakeCell("keydiff", 64, rows=rows([1, 1, 1, 1, 0, 0])),
                               FakeCell("keydiff", 128, rows=rows([1.0] * 6)),
                               FakeCell("full", None, task="ruler.niah_single_1", rows=rows([1.0] * 6))])
    store_run(idx, res, "r2", [FakeCell("sink", 64, rows=rows([0.0] * 6)), FakeCell("sink", 128, rows=rows([0, 1] * 3))])
    board = build_leaderboard(idx, Filters(), LeaderboardOptions(resamples=50))
    path = tmp_path / "leaderboard.html"
    path.write_text(render_page(board), encoding="utf-8")
    return path, board


def test_page_is_self_contained_with_rows_figures_and_controls(page):
    path, board = page
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"(src|href)=['\"]https?:", text)  # nothing loaded from elsewhere
    raw = [json.loads(m.replace("&quot;", '"').replace("&amp;", "&"))
           for m in re.findall(r'data-row="([^"]*)"', text)]
    assert [r["cell"] for r in raw] == [r.cell for r in board.rows]  # every row, in rank order, read back
    assert text.count("<figure") == 2 and text.count("data:image/png;base64,") == 2  # needle and ruler
    assert "id='search'" in text and 'class="sortable"' in text and "aria-sort" in text


PROBE = """<script>
window.addEventListener('load', function () {
  const heads = Array.from(document.querySelectorAll('#board thead th'));
  const score = heads.find(h => h.textContent === 'score');
  const policies = () => Array.from(document.querySelectorAll('#board tbody tr'))
      .filter(r => r.style.display !== 'none').map(r => r.cells[heads.indexOf(heads.find(h => h.textContent === 'policy'))].textContent + '/' + r.cells[heads.indexOf(score)].textContent);
  score.click();
  document.body.setAttribute('data-asc', policies().join(','));
  score.click();
  document.body.setAttribute('data-desc', policies().join(','));
  const search = document.getElementById('search');
  search.value = 'sink 128';
  search.dispatchEvent(new Event('input'));
  document.body.setAttribute('data-found', policies().join(','));
  document.body.setAttribute('data-shown', document.getElementById('shown').textContent);
  let ok = 0; for (const img of document.images) { if (img.complete && img.naturalWidth > 0) ok++; }
  document.body.setAttribute('data-images-ok', ok + '/' + document.images.length);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
def test_headers_sort_and_search_filters_in_chromium(page, tmp_path):
    path, _ = page
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text(encoding="utf-8").replace("</head>", PROBE + "</head>", 1), encoding="utf-8")
    dom, err = _chromium(["--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                          probed.as_uri()])

    def attr(name: str) -> str:
        return re.search(f'{name}="([^"]*)"', dom).group(1)

    asc = [x.split("/")[1] for x in attr("data-asc").split(",")]
    assert asc == sorted(asc, key=float) and asc[0] == "0.00"
    desc = [x.split("/")[1] for x in attr("data-desc").split(",")]
    assert desc == sorted(desc, key=float, reverse=True)
    assert attr("data-found") == "sink/50.00" and attr("data-shown") == "1 of 6 rows"
    assert attr("data-images-ok") == "2/2"
    assert [ln for ln in err.splitlines() if "Uncaught" in ln or "CONSOLE" in ln] == []
