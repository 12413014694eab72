"""The leaderboard a nightly keeps beside its history page: every done cell of the index for the nightly grid's
models and tasks, from any run (:mod:`kdeval.jobs.reports.leaderboard.build`), rewritten every night as
``<report_dir>/leaderboard.html``; the history page links to it."""
from __future__ import annotations

from pathlib import Path

from kdeval.jobs.nightly.spec import NightlyFile
from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard
from kdeval.jobs.reports.leaderboard.cells import Filters, LeaderboardInputError
from kdeval.jobs.reports.leaderboard.output import PAGE, write_files
from kdeval.storage import RunIndex

__all__ = ["PAGE", "write_leaderboard"]


def write_leaderboard(index: RunIndex, nf: NightlyFile, out_dir: Path) -> Path | None:
    """Write the leaderboard of ``nf``'s models and tasks into ``out_dir``; its path, or None when the index holds
    no done cell of them (a first night whose cells all failed)."""
    spec = nf.spec
    filters = Filters(models=tuple(dict.fromkeys(m.id for m in nf.grid.models)),
                      tasks=tuple(dict.fromkeys(t.name for t in nf.grid.tasks)))
    options = LeaderboardOptions(resamples=spec.resamples, seed=spec.seed, confidence=spec.confidence)
    try:
        board = build_leaderboard(index, filters, options)
    except LeaderboardInputError:  # no done cell of a model or task yet: nothing to rank
        return None
    return write_files(board, out_dir, ["html"])["html"] if board.rows else None
