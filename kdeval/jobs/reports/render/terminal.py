"""The terminal view of a report: the tables of :mod:`kdeval.jobs.reports.render.views` laid out for the console's
width by :func:`kdeval.jobs.reports.render.layout.render` (nothing cut), and the report's warnings (one line each).
"""
from __future__ import annotations

from rich.console import RenderableType
from rich.markup import escape

from kdeval.jobs.reports.report_rows import Report
from kdeval.jobs.reports.render.layout import render
from kdeval.jobs.reports.render.views import cells_view, memory_view, scores_view, speed_view

def scores_table(report: Report, width: int, detail: bool = False) -> RenderableType:
    """Scores per policy × budget × metric with Δ and CI (``detail``: also per length / depth / level)."""
    rows = [r for r in report.scores if detail or r.level != "detail"]
    return render(scores_view(report, rows), width)


def speed_table(report: Report, width: int) -> RenderableType:
    """TTFT and decode tokens/s per cell with their ratios to the reference and the ratios' CIs."""
    return render(speed_view(report), width)


def memory_table(report: Report, width: int) -> RenderableType:
    """Prompt length, peak KV tokens and bytes, mem × and the process/GPU peak per cell."""
    return render(memory_view(report), width)


def cells_table(report: Report, width: int) -> RenderableType | None:
    """Cells that failed, have not run, whose result file is not intact, or are missing (None when none)."""
    view = cells_view(report)
    return None if view is None else render(view, width)


def contrast_tables(report: Report, width: int) -> list[RenderableType]:
    """The cost-of-chunking and query-dependence tables the runs hold both sides of (none, one or two), and the
    accuracy per KV byte when a cell is quantized."""
    from kdeval.jobs.reports.render.contrast_views import CONTRASTS, contrast_view
    from kdeval.jobs.reports.render.frontier_views import frontier_view

    views = [contrast_view(report, name) for name in CONTRASTS] + [frontier_view(report)]
    return [render(v, width) for v in views if v is not None]


def conversation_tables(report: Report, width: int) -> list[RenderableType]:
    """Score by turn and query dependence by turn, when the runs hold conversations."""
    from kdeval.jobs.reports.render.turn_views import conversation_views

    return [render(v, width) for v in conversation_views(report)]


def broken_table(report: Report, width: int) -> RenderableType | None:
    """The samples the reference answers and a policy does not (None when there is none)."""
    from kdeval.jobs.reports.render.turn_views import broken_view

    view = broken_view(report)
    return None if view is None else render(view, width)


def length_table(report: Report, width: int) -> RenderableType | None:
    """Generated tokens against the reference's, per cell (None when nothing pairs)."""
    from kdeval.jobs.reports.render.turn_views import length_view

    view = length_view(report)
    return None if view is None else render(view, width)


def warning_lines(report: Report) -> list[str]:
    """The report's warnings as rich markup, one line each (printed after the tables)."""
    return [f"[bold yellow]warning:[/] {escape(w)}" for w in report.meta.warnings]
