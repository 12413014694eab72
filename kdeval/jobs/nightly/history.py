"""The nightly history (``history.jsonl`` in the report directory, one entry per gated night) and what it
decides: the baseline a night is compared with, the unfinished night to resume, and the history page."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kdeval.jobs.nightly.history_page import write_history_page
from kdeval.jobs.reports.leaderboard.output import PAGE as LEADERBOARD_PAGE
from kdeval.jobs.nightly.spec import NightlyFile, NightlySpec
from kdeval.jobs.run.drivers import driver_alive
from kdeval.storage import RunIndex, RunState

HISTORY = "history.jsonl"


def read_history(report_dir: Path) -> list[dict[str, Any]]:
    """Past nightlies, oldest first (``history.jsonl`` lines)."""
    path = report_dir / HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_history(report_dir: Path, entry: dict[str, Any]) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    with open(report_dir / HISTORY, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def choose_baseline(index: RunIndex, spec: NightlySpec, ghash: str, current: str,
                    history: list[dict[str, Any]]) -> str | None:
    """The pinned run, else the last passing nightly of this grid, else its newest other done run that
    did not fail a nightly gate (so a regression never becomes tomorrow's baseline).

    ``history`` is :func:`read_history` of the report directory."""
    if spec.baseline != "last":
        rid = index.resolve_run_id(spec.baseline)
        if rid is None:
            raise ValueError(f"nightly.baseline: no run '{spec.baseline}'")
        return rid
    runs = index.runs_of_grid(ghash)
    known = {rid for rid, _ in runs}
    for entry in reversed(history):
        if entry.get("passed") and entry.get("grid_hash") == ghash and entry["run"] != current and entry["run"] in known:
            return entry["run"]
    failed_gate = {e["run"] for e in history if not e.get("passed")}
    for rid, state in runs:
        if rid != current and state == RunState.DONE.value and rid not in failed_gate:
            return rid
    return None


def run_to_resume(index: RunIndex, ghash: str, history: list[dict[str, Any]]) -> str | None:
    """The newest run of this grid if it never finished and was never gated (a nightly that died).

    ``history`` is :func:`read_history` of the report directory."""
    gated = {e["run"] for e in history}
    runs = index.runs_of_grid(ghash)
    if not runs:
        return None
    rid, state = runs[0]
    if rid in gated or state == RunState.DONE.value:
        return None
    view = index.get_run(rid)
    return None if view is None or driver_alive(view) else rid


def write_history(nightly_file: NightlyFile, out_dir: Path, report_dir: str | Path | None = None) -> Path:
    """``kdeval nightly history``: the history page of a nightly file's grid, written to ``out_dir``."""
    root = Path(report_dir or nightly_file.spec.report_dir)
    mine = [e for e in read_history(root) if e.get("grid") == nightly_file.grid.name]
    return write_history_page(mine, out_dir, f"kdeval nightly {nightly_file.grid.name}: history",
                              root / LEADERBOARD_PAGE)
