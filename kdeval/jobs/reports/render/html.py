"""The HTML report: one self-contained file (inline CSS, PNG plots inlined as base64, no external URL),
laid out like a paper's figure page.

First what was compared and its warnings, then the headline table (policy × budget rows, one column per
benchmark: the score and its Δ with CI) and the figures (score vs budget with CI bars, needle heatmaps, KV
memory vs prompt length); the cells not done, if any; then the details: every score, speed, memory,
provenance and the slices. Tables read like the terminal's (:mod:`kdeval.jobs.reports.render.views`): text
left-aligned, numbers right-aligned, headers that stay in view while scrolling. Each detail row carries its
raw row (``data-row``), so the page can be read back exactly (the tests do).
"""
from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

from kdeval.jobs.reports.report_rows import FULL, MEMORY_KINDS, Report
from kdeval.jobs.reports.render import turn_views, views
from kdeval.jobs.reports.render.formats import fields_view, html_table
from kdeval.jobs.reports.render.layout import TableView

if TYPE_CHECKING:
    from kdeval.jobs.reports.render.plots import Plot

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; background: #fff;
       margin: 0 auto; padding: 1.2em 2em 3em; max-width: 1400px; }
h1 { font-size: 1.45em; margin: .2em 0 .3em; }
h2 { font-size: 1.15em; margin: 1.8em 0 .5em; padding-bottom: .2em; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1em; margin: 1.2em 0 .3em; color: #444; }
.meta { color: #57606a; margin: 0 0 .8em; padding: 0; list-style: none; }
.meta li { display: inline; } .meta li + li:before { content: "  ·  "; }
.warning { background: #fff8c5; border-left: 4px solid #d4a72c; padding: .35em .7em; margin: .4em 0; }
.alert { background: #ffebe9; border-left: 4px solid #cf222e; padding: .35em .7em; margin: .4em 0; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: 13px; }
th, td { padding: 3px 9px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
thead th { position: sticky; top: 0; z-index: 1; background: #f6f8fa; border-bottom: 2px solid #d0d7de;
           font-weight: 600; white-space: nowrap; }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.txt { text-align: left; }
td.txt { max-width: 36em; overflow-wrap: break-word; } td.key { white-space: nowrap; }
td.fold { overflow-wrap: anywhere; }
tbody tr:hover td { background: #f6f8fa; }
tr.failed td, tr.missing td { background: #ffebe9; } tr.partial td { background: #fff8c5; }
tr.pending td, tr.running td { color: #8c959f; }
table.headline { font-size: 14px; }
table.headline td.score { text-align: right; min-width: 9em; }
table.headline .v { font-size: 1.1em; font-weight: 600; font-variant-numeric: tabular-nums; }
table.headline .d { display: block; font-size: .85em; color: #57606a; font-variant-numeric: tabular-nums;
                    white-space: nowrap; }
table.headline .worse { color: #bc4c00; } table.headline .better { color: #0550ae; }
table.headline tr.ref td { background: #f6f8fa; }
.caption { color: #57606a; font-size: .9em; margin: -.6em 0 1em; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 1em; }
.figures figure { margin: 0; } .figures figure.wide { grid-column: 1 / -1; } .figures img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
.figures figcaption { font-size: .85em; color: #57606a; }
details { margin: .6em 0; } summary { cursor: pointer; color: #0550ae; }
table.setups td:last-child { min-width: 24em; }
"""

_CAPTIONS = {
    "score_vs_budget": "Bars: the CI of Δ vs the reference, paired by sample id. Dashed line: the full cache.",
    "needle_heatmap": "Accuracy (points) and samples n per length × depth; darker is worse.",
    "memory_vs_length": "Peak bytes of K/V held by the cache (weights excluded), per policy and task.",
    "cost_of_chunking": "Δ chunked − one-shot (points) with its CI, paired by sample id; 0: chunking costs nothing.",
    "query_dependence": "Δ query-aware − query-agnostic (points) with its CI, paired by sample id.",
    "kv_frontier": "Score vs peak KV-cache bytes; filled: on the Pareto frontier (dashed staircase), hollow: "
                   "dominated; colour: bits per stored number.",
}
#: Figures drawn in their own sections (not among the others).
CONTRAST_KINDS = ("cost_of_chunking", "query_dependence", "score_vs_turn", "kv_frontier")  # figures shown in their own section


def _img(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    alt = html.escape(plot.title)
    caption = html.escape(_CAPTIONS.get(plot.kind, ""))
    wide = ' class="wide"' if plot.kind == "needle_heatmap" else ""  # one panel per policy: the full width
    return (f'<figure{wide}><img alt="{alt}" title="{alt}" src="data:image/png;base64,{data}">'
            f"<figcaption>{caption}</figcaption></figure>")


def _headline(h: views.Headline) -> str:
    """One headline table: the score in bold, Δ and CI below it, coloured when the CI excludes 0."""
    head = "".join(f'<th class="num">{html.escape(m)}</th>' for m in h.metrics)
    body = []
    for label, cells in h.rows:
        tds = []
        for c in cells:
            if c is None:
                tds.append('<td class="score"></td>')
                continue
            delta = ""
            if c.delta:
                delta = f'<span class="d {c.tone}">Δ {html.escape(c.delta)} {html.escape(c.ci)}</span>'
            tds.append(f'<td class="score {html.escape(c.state)}"><span class="v">{html.escape(c.score)}</span>'
                       f"{delta}</td>")
        ref = ' class="ref"' if label == FULL else ""
        body.append(f'<tr{ref}><td class="txt">{html.escape(label)}</td>{"".join(tds)}</tr>')
    return (f"<h3>{html.escape(h.title)}</h3><table class=\"headline\"><thead><tr><th class=\"txt\">policy</th>"
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _perf_legend(report: Report) -> str:
    """What the memory columns measure."""
    kinds = sorted({p.memory_kind for p in report.perf if p.memory_kind})
    peak = " or ".join(MEMORY_KINDS.get(k, k) for k in kinds) or "process or GPU peak, kind not recorded"
    return (f'<p class="caption">mem × = peak bytes of K/V held by the cache over the reference\'s. The last '
            f"column, {html.escape(peak)}, includes the model's weights.</p>")


def _provenance(report: Report) -> list[str]:
    """The provenance section: one row per distinct setup with the cells that ran on it, then every row."""
    setups = views.provenance_view(report)
    if setups is None:
        return []
    return ["<h2>Provenance</h2>", html_table(setups, css_class="setups"),
            "<details><summary>every cell</summary>",
            html_table(fields_view("provenance", report.provenance), source="provenance"), "</details>"]


def _table(view: TableView, source: str | None) -> str:
    caption = f'<p class="caption">{html.escape(view.caption)}</p>' if view.caption and view.rows else ""
    return f"<h3>{html.escape(view.title)}</h3>{html_table(view, source=source)}{caption}"


def contrast_sections(report: Report, plots: list[Plot]) -> list[str]:
    """Cost of chunking and query dependence: per section its figure (Δ with CI per row) and its table."""
    from kdeval.jobs.reports.render.contrast_views import CONTRASTS, contrast_view

    parts = []
    for name, (title, _, _) in CONTRASTS.items():
        view = contrast_view(report, name)
        if view is None:
            continue
        figs = "".join(_img(p) for p in plots if p.kind == name)
        parts += [f'<h2 id="{name}">{html.escape(title)}</h2>',
                  f'<div class="figures">{figs}</div>' if figs else "", _table(view, name)]
    return parts + frontier_section(report, plots)


def frontier_section(report: Report, plots: list[Plot]) -> list[str]:
    """Accuracy per KV byte: one figure per task and the frontier table (nothing when no cell is quantized)."""
    from kdeval.jobs.reports.render.frontier_views import TITLE, frontier_view

    view = frontier_view(report)
    if view is None:
        return []
    figs = "".join(_img(p) for p in plots if p.kind == "kv_frontier")
    return [f'<h2 id="kv_frontier">{html.escape(TITLE)}</h2>',
            f'<div class="figures">{figs}</div>' if figs else "", _table(view, "kv_frontier")]


def conversation_sections(report: Report, plots: list[Plot]) -> list[str]:
    """Conversations by turn (the score-vs-turn figures, the turn table, query dependence by turn) and what
    compression broke."""
    parts = []
    tables = turn_views.conversation_views(report)
    if tables:
        figs = "".join(_img(p) for p in plots if p.kind == "score_vs_turn")
        parts += ['<h2 id="turns">Conversations by turn</h2>', f'<div class="figures">{figs}</div>' if figs else ""]
        parts += [_table(v, v.name) for v in tables]
    broken = turn_views.broken_view(report)
    if broken is not None:
        parts += ['<h2 id="broken">What compression broke</h2>', _table(broken, "broken")]
    return parts


def render_html(report: Report, plots: list[Plot], title: str = "kdeval report") -> str:
    """The complete HTML document."""
    m = report.meta
    ref = "the full cache (same model × chunk × task)" if m.compare == FULL else f"run {m.compare}"
    meta = [f"runs: {', '.join(m.runs)}", f"compared with: {ref}", f"Δ = {m.method}", f"created: {m.created}"]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><ul class=\"meta\">",
             "".join(f"<li>{html.escape(x)}</li>" for x in meta), "</ul>"]
    parts += [f'<p class="warning"><b>warning:</b> {html.escape(w)}</p>' for w in m.warnings]
    parts += [f'<p class="caption">note: {html.escape(n)}</p>' for n in m.notes]
    if report.cells:
        parts.append(f'<p class="alert"><b>{len(report.cells)} cell(s) not done or missing</b>: their numbers are '
                     f'absent below; see <a href="#cells">the list</a>.</p>')
    headlines = views.headline_views(report)
    if headlines:
        parts += ["<h2>Headline</h2>"] + [_headline(h) for h in headlines]
        few = views.legend([row for h in headlines for row in h.as_table().rows])
        parts.append(f'<p class="caption">{html.escape(few + ". " if few else "")}Δ in colour: its CI excludes 0 '
                     "(orange: worse than the reference, blue: better).</p>")
    figures = [p for p in plots if p.kind not in CONTRAST_KINDS]
    if figures:
        parts += ["<h2>Figures</h2><div class=\"figures\">", "".join(_img(p) for p in figures), "</div>"]
    if report.cells:
        parts += [f"<h2 id=\"cells\">Cells not done or missing ({len(report.cells)})</h2>",
                  html_table(views.cells_view(report), source="cells")]
    scores = [r for r in report.scores if r.level != "detail"]
    detail = [r for r in report.scores if r.level == "detail"]
    parts += ["<h2>Scores</h2>", _table(views.scores_view(report, scores), "scores")]
    parts += contrast_sections(report, plots)
    parts += conversation_sections(report, plots)
    if report.perf:
        length = turn_views.length_view(report)
        parts += ["<h2>Speed and memory per cell</h2>", _table(views.speed_view(report), "perf"),
                  _table(length, "answer_length") if length is not None else "",
                  _table(views.memory_view(report), None), _perf_legend(report)]
    parts += _provenance(report)
    if detail:
        parts += [f"<h2>Slices ({len(detail)} rows)</h2><details><summary>lengths, depths, levels, buckets"
                  "</summary>", _table(views.scores_view(report, detail), "scores"), "</details>"]
    parts.append("</body></html>")
    return "\n".join(parts)
