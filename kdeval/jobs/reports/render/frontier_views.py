"""The accuracy-per-KV-byte frontier as a reader sees it: a table (terminal, Markdown, HTML) and, per task, a figure
of score against peak KV bytes with the Pareto frontier drawn through its configurations
(:class:`~kdeval.jobs.reports.report_rows.FrontierRow`, kdeval/jobs/reports/frontier.py)."""
from __future__ import annotations

from kdeval.jobs.reports.report_rows import FrontierRow, Report, State
from kdeval.jobs.reports.render.layout import Column, TableView
from kdeval.jobs.reports.render.units import bytes_unit, interval, points, text
from kdeval.jobs.reports.render.views import legend
from kdeval.jobs.reports.render.figure_text import literal_text

TITLE = "Accuracy per KV byte"
CAPTION = ("KV = peak bytes of K/V the cache held (a quantized store: codes, scales, zeros and its full-precision "
           "window); frontier: no configuration scores at least as much with at most these bytes; Δ: this − the "
           "best other configuration within its bytes (paired by sample id), the winner's margin at that byte level")


def frontier_view(report: Report) -> TableView | None:
    """The frontier table, lowest bytes first per model × task; None when no cell of the runs is quantized."""
    rows = report.kv_frontier
    if not rows:
        return None
    conf = int(report.meta.confidence * 100)
    models = sorted({r.model for r in rows})
    unit, div = bytes_unit([r.kv_bytes for r in rows])
    cols = ([Column("model", key=True)] if len(models) > 1 else []) + [
        Column("task", key=True), Column("configuration", key=True), Column("bits", numeric=True),
        Column(f"KV {unit}", numeric=True), Column("n", numeric=True), Column("score", numeric=True),
        Column("frontier", key=True), Column(f"Δ vs next [{conf}% CI]", numeric=True), Column("next / dominated by"),
        Column("note", fold=True)]
    body = []
    for r in rows:
        delta = f"{points(r.delta, signed=True)} {interval(r.ci_low, r.ci_high, 'ci_low', r.n_paired)}".strip()
        note = "; ".join(x for x in ("" if r.state == State.OK else r.state, r.note) if x)
        body.append(([r.model] if len(models) > 1 else []) + [
            r.task, r.config, "" if r.kv_bits is None else str(r.kv_bits), text(r.kv_bytes, "kv_bytes", div),
            str(r.n), text(r.value, "value"), "yes" if r.position == "frontier" else r.position, delta,
            r.runner_up or r.dominated_by, note])
    suffix = f" — {models[0]}" if len(models) == 1 else ""
    cap = "; ".join(x for x in (CAPTION, legend(body)) if x)
    return TableView("kv_frontier", f"{TITLE.lower()}: score vs peak KV bytes{suffix}", cols, body,
                     [r.state for r in rows], list(rows), cap)


@literal_text
def frontier_figure(task: str, rows: list[FrontierRow]):
    """Score (points) against peak KV bytes (log scale) of one task's configurations: the frontier joined as a
    staircase and labelled, dominated ones hollow; colour by bits per stored number."""
    from matplotlib.figure import Figure

    from kdeval.jobs.reports.render.plots import COLORS

    pts = [r for r in rows if r.value is not None and r.kv_bytes is not None]
    fig = Figure(figsize=(7.2, 4.2), layout="constrained")
    ax = fig.subplots()
    bits = sorted({r.kv_bits or 0 for r in pts}, reverse=True)
    for b in bits:
        color = COLORS[bits.index(b) % len(COLORS)]
        mine = [r for r in pts if (r.kv_bits or 0) == b]
        label = f"{b} bits" if b else "model width"
        for on, face in ((True, color), (False, "none")):
            sel = [r for r in mine if (r.position == "frontier") == on]
            if sel:
                ax.scatter([r.kv_bytes for r in sel], [r.value for r in sel], s=36, edgecolors=color,
                           facecolors=face, label=label if on or not any(r.position == "frontier" for r in mine)
                           else None)
    front = sorted((r for r in pts if r.position == "frontier"), key=lambda r: r.kv_bytes)
    if front:
        ax.step([r.kv_bytes for r in front], [r.value for r in front], where="post", color="#57606a",
                linewidth=1, linestyle="--")
        for r in front:
            ax.annotate(r.config, (r.kv_bytes, r.value), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("peak KV-cache bytes (log)")
    ax.set_ylabel("score (points)")
    ax.set_title(f"{TITLE}: {task}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def frontier_plots(report: Report) -> list:
    """One figure per model × task with a frontier."""
    from kdeval.jobs.reports.render.plots import Plot, _png, _slug

    groups: dict[tuple[str, str], list[FrontierRow]] = {}
    for r in report.kv_frontier:
        groups.setdefault((r.model, r.task), []).append(r)
    plots = []
    for (model, task), rows in groups.items():
        if any(r.position == "frontier" for r in rows):
            title = f"{TITLE}: {task}" + (f" ({model})" if len(groups) > 1 else "")
            plots.append(Plot("kv_frontier", title, _slug("kv_frontier", model, task),
                              _png(frontier_figure(task, rows))))
    return plots
