"""The cost-of-chunking and query-dependence tables as a reader sees them (terminal, Markdown, HTML).

One row per policy × budget × task × shared setting: both sides' scores over the paired samples, Δ = a − b
with its CI, and both sides' peak KV-cache bytes and median TTFT (:class:`~kdeval.jobs.reports.report_rows.ContrastRow`).
"""
from __future__ import annotations

from kdeval.jobs.reports.report_rows import ContrastRow, Report, State
from kdeval.jobs.reports.render.layout import Column, TableView
from kdeval.jobs.reports.render.units import bytes_unit, interval, points, text
from kdeval.jobs.reports.render.views import legend

#: Report table -> (section title, what Δ is, what the caption says).
CONTRASTS = {
    "cost_of_chunking": ("Cost of chunking", "chunked − one-shot",
                         "one-shot (B=whole) compresses once after prefilling everything compressed: its KV cache "
                         "is not bounded by N + B, it grows with the prompt"),
    "query_dependence": ("Query dependence", "query-aware − query-agnostic",
                         "query-aware: the question is compressed with the context (compress: prompt); "
                         "query-agnostic: only the context is, the question is kept (compress: context)"),
}
#: Contrasts drawn with the conversations' tables, not in their own section.
TURN_CONTRASTS = {
    "query_dependence_by_turn": ("Query dependence by turn", "query-aware − query-agnostic",
                                 "per turn of the conversations: query-aware compression saw turn 1's question only"),
}


def _budget(b) -> str:
    return "-" if b is None else str(b)


def contrast_view(report: Report, name: str) -> TableView | None:
    """The table of ``name`` (``cost_of_chunking`` or ``query_dependence``); None when the runs lack a side."""
    rows: list[ContrastRow] = getattr(report, name)
    if not rows:
        return None
    title, what, caption = {**CONTRASTS, **TURN_CONTRASTS}[name]
    conf = int(report.meta.confidence * 100)
    models = sorted({r.model for r in rows})
    unit, div = bytes_unit([r.a_kv_bytes for r in rows] + [r.b_kv_bytes for r in rows])
    cols = ([Column("model", key=True)] if len(models) > 1 else []) + [
        Column("policy", key=True), Column("N", numeric=True), Column("task", key=True), Column("setting", key=True),
        Column("a vs b", key=True), Column("n", numeric=True), Column("a", numeric=True), Column("b", numeric=True),
        Column(f"Δ [{conf}% CI]", numeric=True), Column(f"KV a {unit}", numeric=True),
        Column(f"KV b {unit}", numeric=True), Column("TTFT a s", numeric=True), Column("TTFT b s", numeric=True),
        Column("note", fold=True)]
    body = []
    for r in rows:
        delta = f"{points(r.delta, signed=True)} {interval(r.ci_low, r.ci_high, 'ci_low', r.n_paired)}".strip()
        note = "; ".join(x for x in ("" if r.state == State.OK else r.state, r.note) if x)
        body.append(([r.model] if len(models) > 1 else []) + [
            r.policy, _budget(r.budget), r.task, r.setting, f"{r.a_label} vs {r.b_label}", str(r.n_paired),
            text(r.a_value, "a_value"), text(r.b_value, "b_value"), delta, text(r.a_kv_bytes, "a_kv_bytes", div),
            text(r.b_kv_bytes, "b_kv_bytes", div), text(r.a_ttft_s, "a_ttft_s"), text(r.b_ttft_s, "b_ttft_s"), note])
    suffix = f" — {models[0]}" if len(models) == 1 else ""
    full_title = f"{title.lower()}: Δ = {what} (points, paired by sample id){suffix}"
    cap = "; ".join(x for x in (caption, legend(body)) if x)
    return TableView(name, full_title, cols, body, [r.state for r in rows], list(rows), cap)
