"""Writing a report in the requested formats into a directory (what ``--format``/``--out`` do)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from kdeval.jobs.reports.report_rows import Report
from kdeval.jobs.reports.render import formats

#: Formats ``kdeval report --format`` accepts ("table" is the terminal view).
FORMATS = ("table", "md", "csv", "json", "html")


def parse_formats(text: str) -> list[str]:
    """``"md,html"`` -> ``["md", "html"]``; an unknown name is a ``ValueError`` naming the allowed ones."""
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in FORMATS]
    if bad or not names:
        raise ValueError(f"--format: unknown format {bad[0] if bad else text!r}; expected one or more of "
                         f"{', '.join(FORMATS)} (comma-separated)")
    return list(dict.fromkeys(names))


def write_report(report: Report, out_dir: str | Path, fmts: Iterable[str], title: str = "kdeval report") -> dict[str, Path]:
    """Write ``report`` as each of ``fmts`` (``table`` is skipped) into ``out_dir``; returns format -> path.

    ``html`` also writes its plots as PNG files under ``plots/`` (the HTML file does not need them)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for fmt in fmts:
        if fmt == "json":
            written[fmt] = formats.write_text(out / "report.json", formats.to_json(report))
        elif fmt == "md":
            written[fmt] = formats.write_text(out / "report.md", formats.to_markdown(report))
        elif fmt == "csv":
            written[fmt] = formats.write_csv(report, out)[0]
        elif fmt == "html":
            from kdeval.jobs.reports.render.html import render_html
            from kdeval.jobs.reports.render.contrast_plots import contrast_plots  # matplotlib: only when a page is written
            from kdeval.jobs.reports.render.plots import all_plots

            from kdeval.jobs.reports.render.frontier_views import frontier_plots
            from kdeval.jobs.reports.render.turn_plots import turn_plots

            plots = all_plots(report) + contrast_plots(report) + turn_plots(report) + frontier_plots(report)
            if plots:
                (out / "plots").mkdir(exist_ok=True)
            for p in plots:
                (out / "plots" / f"{p.slug}.png").write_bytes(p.png)
            written[fmt] = formats.write_text(out / "report.html", render_html(report, plots, title))
    return written
