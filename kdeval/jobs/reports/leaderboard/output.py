"""Writing a leaderboard's files: ``leaderboard.<format>`` for md, csv, json and html, in one directory."""
from __future__ import annotations

from pathlib import Path

from kdeval.jobs.reports.leaderboard.build import Leaderboard
from kdeval.jobs.reports.render.formats import write_text
from kdeval.jobs.reports.leaderboard.views import to_csv, to_json, to_markdown

#: The page's file name (``kdeval report`` and the nightly history page point at it).
PAGE = "leaderboard.html"


def write_files(board: Leaderboard, out_dir: Path, fmts: list[str]) -> dict[str, Path]:
    """Write each of ``fmts`` (md, csv, json, html) as ``leaderboard.<ext>`` into ``out_dir``; format -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for fmt in fmts:
        if fmt == "html":
            from kdeval.jobs.reports.leaderboard.html import render_page  # matplotlib: only for a page

            text = render_page(board)
        else:
            text = {"md": to_markdown, "csv": to_csv, "json": to_json}[fmt](board)
        written[fmt] = write_text(out_dir / f"leaderboard.{fmt}", text)
    return written
