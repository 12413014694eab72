"""Reports: aggregation of stored results into paired deltas with bootstrap CIs, output formats, plots,
the HTML report and the nightly regression gate.

    from kdeval.jobs.reports import ReportOptions, build_report
    report = build_report(index, [run_id], ReportOptions(compare="full"))
"""
from kdeval.jobs.reports.aggregate import ReportOptions, build_report
from kdeval.jobs.reports.model import CellRow, MetricRow, PerfRow, ProvenanceRow, Report, ReportMeta, State

__all__ = ["ReportOptions", "build_report", "CellRow", "MetricRow", "PerfRow", "ProvenanceRow", "Report",
           "ReportMeta", "State"]
