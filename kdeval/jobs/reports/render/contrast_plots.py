"""Figures of the cost-of-chunking and query-dependence rows: Δ with its CI per row, a zero line."""
from __future__ import annotations

from matplotlib.figure import Figure

from kdeval.jobs.reports.report_rows import ContrastRow, Report
from kdeval.jobs.reports.render.contrast_views import CONTRASTS
from kdeval.jobs.reports.render.plots import COLORS, Plot, _png, _slug
from kdeval.jobs.reports.render.figure_text import literal_text


def _label(r: ContrastRow) -> str:
    budget = "" if r.budget is None else f" N={r.budget}"
    return f"{r.policy}{budget} · {r.task} · {r.setting}" + (f" · {r.a_label}" if r.a_label.startswith("B=") else "")


@literal_text
def contrast_figure(title: str, rows: list[ContrastRow]) -> Figure:
    """One horizontal bar per row: its Δ (points) as a dot and its CI as a bar, policies by colour."""
    rows = [r for r in rows if r.delta is not None]
    fig = Figure(figsize=(7.2, 0.9 + 0.32 * len(rows)), layout="constrained")
    ax = fig.subplots()
    policies = list(dict.fromkeys(r.policy for r in rows))
    for y, r in enumerate(rows):
        color = COLORS[policies.index(r.policy) % len(COLORS)]
        lo, hi = r.ci_low if r.ci_low is not None else r.delta, r.ci_high if r.ci_high is not None else r.delta
        ax.plot([lo, hi], [y, y], color=color, linewidth=2.5, alpha=0.6)
        ax.plot([r.delta], [y], "o", color=color)
    ax.axvline(0.0, color="#57606a", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Δ (points)")
    ax.set_title(title, fontsize=10)
    return fig


def contrast_plots(report: Report) -> list[Plot]:
    """One figure per contrast the report holds (rows with a Δ)."""
    plots = []
    for name, (title, what, _) in CONTRASTS.items():
        rows = getattr(report, name)
        if any(r.delta is not None for r in rows):
            full = f"{title}: Δ = {what}"
            plots.append(Plot(name, full, _slug(name), _png(contrast_figure(full, rows))))
    return plots
