"""The parts of `kdeval nightly` beyond the gate's tables: `kdeval nightly history GRID --out DIR`, the
``--json`` verdict summary, and the lines that name speed regressions, drifts, the attribution and on_fail."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape

#: The gate.json keys ``--json`` prints (the per-night series the history page needs are left out).
SUMMARY_KEYS = ("run", "grid", "grid_hash", "baseline", "passed", "checked", "regressions", "speed_regressions",
                "drift", "failed_cells", "time", "reuse", "attribution", "on_fail")


def verdict_summary(summary: dict[str, Any]) -> str:
    """The ``--json`` output: the verdict and what decided it (one JSON object)."""
    return json.dumps({k: summary[k] for k in SUMMARY_KEYS if k in summary}, indent=2, default=str)


def print_extras(out: Console, summary: dict[str, Any]) -> None:
    """Speed regressions, drifts, the attribution's causes and the on_fail command's outcome."""
    for text in summary.get("speed_regressions", []):
        out.print(f"[bold red]SPEED[/] {escape(text)}", highlight=False)
    for d in summary.get("drift", []):
        out.print(f"[bold yellow]DRIFT[/] {escape(d['text'])}", highlight=False)
    attribution = summary.get("attribution")
    if attribution:
        for r in attribution["regressions"]:
            for c in r["cells"][:3]:
                out.print(f"  driven by {escape(c['text'])}", highlight=False)
        for c in attribution["changes"]:
            out.print(f"  changed: {escape(c['what'])}: {escape(c['baseline'])} → {escape(c['tonight'])}",
                      highlight=False)
    hook = summary.get("on_fail")
    if hook is not None:
        state = "ran" if hook["ok"] else f"FAILED ({hook['error']}; the verdict stands)"
        out.print(f"on_fail {escape(' '.join(hook['command']))}: {escape(state)}", highlight=False)


def history(nightly_file: Path, out_dir: Optional[Path], report_dir: Optional[Path], out: Console) -> None:
    """Write the history page of a nightly file's grid (raises ValueError on bad input)."""
    from kdeval.jobs import nightly as nightly_job

    if out_dir is None:
        raise ValueError("kdeval nightly history GRID --out DIR: --out is required")
    nf = nightly_job.load_nightly(nightly_file)
    page = nightly_job.write_history(nf, out_dir, report_dir)
    out.print(f"history: {page}", highlight=False)
