"""Reports: what is computed from stored results (per-sample tables, paired deltas with bootstrap CIs, headlines,
speed and memory, contrasts, provenance) into typed rows; how they are drawn is :mod:`kdeval.jobs.reports.render`.

    from kdeval.jobs.reports import ReportOptions, build_report
    report = build_report(index, [run_id], ReportOptions(compare="full"))

The names below are imported on first use, so that importing a light module of the package (``layout``,
``units``) does not import numpy, pyarrow and the index.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"ReportOptions": "aggregate", "build_report": "aggregate",
            **{name: "report_rows" for name in ("CellRow", "MetricRow", "PerfRow", "ProvenanceRow", "Report",
                                                 "ReportMeta", "State")}}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
