"""The HTML report: one self-contained file (inline CSS, PNG plots inlined as base64, no external URL).

Sections: what was compared (and its warnings); cells not done (failed integrity checks included) or
missing; headline scores (task and benchmark rows); plots; speed and memory; provenance (the distinct setups
and the cells of each, then every cell's row, folded); detail slices (lengths, depths, levels, buckets).
Tables carry every field (``data-table`` attributes), so
:func:`kdeval.jobs.reports.formats.read_html_tables` reads them back.
A tiny inline script counts decoded images into ``<body data-images-ok>`` (the browser test reads it).
"""
from __future__ import annotations

import base64
import html

from kdeval.jobs.reports.formats import html_table
from kdeval.jobs.reports.model import FULL, MEMORY_KINDS, Report
from kdeval.jobs.reports.plots import Plot
from kdeval.jobs.reports.provenance import COMBINATION_KEYS, cell_label, combinations

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 12px; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; position: sticky; top: 0; }
tr.failed td, tr.missing td { background: #fde2e2; } tr.partial td { background: #fff4d6; }
tr.pending td { color: #888; }
.plots figure { display: inline-block; margin: .4em; vertical-align: top; }
.plots img { max-width: 100%; border: 1px solid #eee; }
.meta li { margin: .1em 0; } .wrap { overflow-x: auto; }
.warning { background: #fff4d6; border-left: 4px solid #e0a800; padding: .3em .6em; }
table.setups td.cells { text-align: left; white-space: normal; max-width: 60em; }
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var ok = 0; var imgs = document.images;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  document.body.setAttribute('data-images-ok', String(ok));
  document.body.setAttribute('data-images', String(imgs.length));
});
"""


def _img(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    alt = html.escape(plot.title)
    return f'<figure><img alt="{alt}" title="{alt}" src="data:image/png;base64,{data}"></figure>'


def _perf_legend(report: Report) -> str:
    """What the memory columns of the perf table measure."""
    kinds = sorted({p.memory_kind for p in report.perf if p.memory_kind})
    peak = "; ".join(f"{k}: {MEMORY_KINDS.get(k, k)}" for k in kinds) or "kind not recorded"
    return (f"<p>kv_bytes_ratio (&ldquo;mem &times;&rdquo;): peak bytes of K/V held by the cache, over the "
            f"reference's. peak_memory_bytes is the process/GPU peak, by memory_kind ({html.escape(peak)}).</p>")


def _provenance(report: Report) -> list[str]:
    """The provenance section: one row per distinct setup with the cells that ran on it, then every row."""
    if not report.provenance:
        return []
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ("cells", *COMBINATION_KEYS, "which"))
    body = []
    for setup, members in combinations(report.provenance):
        vals = "".join(f"<td>{html.escape(setup[k]) or '-'}</td>" for k in COMBINATION_KEYS)
        which = html.escape(", ".join(cell_label(r) for r in members))
        body.append(f"<tr><td>{len(members)}</td>{vals}<td class=\"cells\">{which}</td></tr>")
    return ["<h2>Provenance</h2><div class=\"wrap\"><table class=\"setups\"><thead><tr>", head,
            "</tr></thead><tbody>", "".join(body), "</tbody></table></div>",
            "<details><summary>every cell</summary><div class=\"wrap\">",
            html_table("provenance", report.provenance), "</div></details>"]


def render_html(report: Report, plots: list[Plot], title: str = "kdeval report") -> str:
    """The complete HTML document."""
    m = report.meta
    ref = "the full cache (same model × chunk × task)" if m.compare == FULL else f"run {m.compare}"
    meta = [f"runs: {', '.join(m.runs)}", f"compared with: {ref}",
            f"Δ = {m.method}", f"created: {m.created}"] + list(m.notes)
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style><script>{_SCRIPT}</script></head><body>",
             f"<h1>{html.escape(title)}</h1><ul class=\"meta\">",
             "".join(f"<li>{html.escape(x)}</li>" for x in meta), "</ul>"]
    parts += [f'<p class="warning"><b>warning:</b> {html.escape(w)}</p>' for w in m.warnings]
    if report.cells:
        parts += [f"<h2>Cells not done or missing ({len(report.cells)})</h2><div class=\"wrap\">",
                  html_table("cells", report.cells), "</div>"]
    headline = [r for r in report.scores if r.level != "detail"]
    detail = [r for r in report.scores if r.level == "detail"]
    parts += ["<h2>Scores</h2><div class=\"wrap\">", html_table("scores", headline, css_class="headline"), "</div>"]
    if plots:
        parts += ["<h2>Plots</h2><div class=\"plots\">", "".join(_img(p) for p in plots), "</div>"]
    parts += ["<h2>Speed and memory per cell</h2>", _perf_legend(report), "<div class=\"wrap\">",
              html_table("perf", report.perf), "</div>"]
    parts += _provenance(report)
    if detail:
        parts += [f"<h2>Slices ({len(detail)} rows)</h2><details><summary>lengths, depths, levels, buckets"
                  "</summary><div class=\"wrap\">", html_table("scores", detail, css_class="detail"), "</div></details>"]
    parts.append("</body></html>")
    return "\n".join(parts)
