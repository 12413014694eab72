"""What one night adds to ``history.jsonl`` beside its verdict: tracked scores with their CI and threshold,
per-cell speed and memory, the data digests (the history page and the attribution read them back)."""
from __future__ import annotations

from typing import Any

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports import Report
from kdeval.storage import RunIndex


def series_key(metric: str, policy: str, budget: Any, chunk: int, model: str) -> str:
    """How the history names a tracked score: ``needle · keydiff N=64 B=32 · stub:0``."""
    budget_text = "" if budget is None else f" N={budget}"
    return f"{metric} · {policy}{budget_text} B={chunk_text(chunk)} · {model}"


def tracked_points(report: Report, levels: list[str], threshold: Any, regressed: set[int]) -> list[dict[str, Any]]:
    """The night's tracked scores. Against a baseline run: the value, its paired CI around the baseline's
    value (``low``/``high``: baseline value + the delta's CI) and the threshold (baseline value − max_drop);
    ``regressed``: ids of the rows the gate failed. Against the full cache (no baseline yet): the value only."""
    out = []
    by_run = report.meta.compare != "full"
    for r in report.scores:
        if r.level not in levels or r.value is None or r.note == "reference":
            continue
        limit = threshold(r)
        if limit is None:
            continue
        point: dict[str, Any] = {"key": series_key(r.metric, r.policy, r.budget, r.chunk, r.model),
                                 "metric": r.metric, "level": r.level, "policy": r.policy, "budget": r.budget,
                                 "chunk": r.chunk, "model": r.model, "value": r.value, "max_drop": limit,
                                 "low": None, "high": None, "threshold": None, "regressed": id(r) in regressed}
        if by_run and r.ref_value is not None and r.ci_low is not None:
            point.update(low=r.ref_value + r.ci_low, high=r.ref_value + r.ci_high, threshold=r.ref_value - limit)
        out.append(point)
    return out


def perf_points(report: Report) -> list[dict[str, Any]]:
    """Each done cell's median TTFT (over batch timings), median decode tokens/s and peak KV-cache bytes."""
    return [{"model": p.model, "policy": p.policy, "budget": p.budget, "chunk": p.chunk, "task": p.task,
             "ttft_s": p.ttft_median_s, "decode_tok_s": p.decode_tok_s, "peak_kv_bytes": p.peak_kv_bytes}
            for p in report.perf if p.state == "ok"]


def data_digests(index: RunIndex, run_id: str) -> dict[str, str]:
    """Task instance label -> digest of the data its cells read."""
    out = {}
    for v in index.run_cells(run_id):
        task = (v.spec or {}).get("task") or {}
        if task.get("data_digest"):
            out[v.task] = str(task["data_digest"])
    return out

