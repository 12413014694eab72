"""The terminal view of a report: rich tables of scores (task and benchmark rows), speed/memory, bad cells,
and the report's warnings (one line each).

Numbers are printed with the same formatter as the files, so the table shows what the files hold.
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kdeval.jobs.reports.model import DIGITS, FULL, MetricRow, PerfRow, Report, State, memory_label


def _fmt(value, name: str = "value") -> str:
    """A number with the fixed decimals of its field (the same value the files hold)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{DIGITS.get(name, 4)}f}"
    return str(value)


_STYLE = {State.OK: "", State.PARTIAL: "yellow", State.FAILED: "red", State.PENDING: "dim",
          State.MISSING: "red"}


def metric_label(r: MetricRow) -> str:
    """``ruler.avg``, ``ruler.vt @4096``, ``needle @1024 d25.0``, ``math500 level 3``."""
    parts = [r.metric]
    if r.length is not None:
        parts.append(f"@{r.length}")
    if r.depth is not None:
        parts.append(f"d{r.depth:g}")
    if r.subset:
        parts.append(r.subset)
    return " ".join(parts)


def _budget(b: int | None) -> str:
    return "-" if b is None else str(b)


def _delta(r: MetricRow) -> str:
    if r.delta is None:
        return r.note or ""
    sign = "+" if r.delta > 0 else ""
    return f"{sign}{_fmt(r.delta)}"


def _ci(r: MetricRow) -> str:
    return "" if r.ci_low is None else f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]"


def scores_table(report: Report, detail: bool = False) -> Table:
    """Scores per model × policy × budget × chunk × metric with delta and CI."""
    m = report.meta
    ref = "the full cache" if m.compare == FULL else f"run {m.compare}"
    t = Table(title=f"scores of {', '.join(m.runs)} vs {ref} (points; Δ paired by sample id, "
                    f"{int(m.confidence * 100)}% bootstrap CI)",
              caption="\n".join(m.notes) or None)
    for col in ("model", "policy", "N", "B", "metric", "state", "n", "score", "ref", "Δ", "CI", "paired", "dropped"):
        t.add_column(col, justify="right" if col in ("n", "score", "ref", "Δ", "paired", "dropped") else "left",
                     no_wrap=col not in ("metric", "Δ"))
    for r in report.scores:
        if r.level == "detail" and not detail:
            continue
        style = _STYLE.get(r.state, "")
        if r.delta is not None and r.ci_high is not None and r.ci_high < 0:
            style = style or "bold"
        t.add_row(r.model, r.policy, _budget(r.budget), str(r.chunk), metric_label(r), r.state, str(r.n),
                  _fmt(r.value), _fmt(r.ref_value), _delta(r), _ci(r),
                  str(r.n_paired) if r.ref_state != State.REFERENCE else "",
                  str(r.n_dropped) if r.n_dropped else "", style=style)
    return t


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.3f}"


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.2f}"


def _peak_header(rows: list[PerfRow]) -> tuple[str, bool]:
    """The process/GPU peak column's header, and whether each value needs its own kind (mixed kinds)."""
    kinds = {p.memory_kind for p in rows if p.peak_memory_bytes is not None}
    if len(kinds) == 1:
        return f"{memory_label(kinds.pop())} GiB", False
    return "process/GPU peak GiB", len(kinds) > 1


def perf_table(rows: list[PerfRow], compare: str) -> Table:
    """Speed and memory per cell with ratios to the reference; "mem ×" is the ratio of peak KV-cache bytes
    ("-" where either side lacks them), the process/GPU peak is shown under its own label."""
    t = Table(title=f"speed and memory per cell (ratios to {compare}; mem × = peak KV-cache bytes)")
    peak, per_row = _peak_header(rows)
    for col in ("model", "policy", "N", "B", "task", "state", "prompt tok", "TTFT s", "decode tok/s",
                "KV MiB", "peak KV tok", peak, "TTFT ×", "tok/s ×", "mem ×"):
        t.add_column(col, no_wrap=True)
    for p in rows:
        mem = _gib(p.peak_memory_bytes)
        if per_row and mem:
            mem += f" ({memory_label(p.memory_kind)})"
        is_reference = compare == FULL and p.policy == FULL
        mem_x = "" if is_reference else "-" if p.kv_bytes_ratio is None else _fmt(p.kv_bytes_ratio, "kv_bytes_ratio")
        nums = [_fmt(p.prompt_tokens, "prompt_tokens"), _fmt(p.ttft_median_s, "ttft_median_s"),
                _fmt(p.decode_tok_s, "decode_tok_s"), _mib(p.peak_kv_bytes), _fmt(p.peak_kv_tokens), mem,
                _fmt(p.ttft_ratio, "ttft_ratio"), _fmt(p.decode_ratio, "decode_ratio"), mem_x]
        t.add_row(p.model, p.policy, _budget(p.budget), str(p.chunk), p.task, p.state, *nums,
                  style=_STYLE.get(p.state, ""))
    return t


def warning_lines(report: Report) -> list[str]:
    """The report's warnings as rich markup, one line each (printed after the tables)."""
    return [f"[bold yellow]warning:[/] {escape(w)}" for w in report.meta.warnings]


def cells_table(report: Report) -> Table | None:
    """Cells that failed, have not run, whose result file is not intact, or are missing (None when none)."""
    if not report.cells:
        return None
    t = Table(title="cells not done or missing", title_style="bold red")
    for col in ("run", "cell", "model", "policy", "N", "B", "task", "state"):
        t.add_column(col, no_wrap=True)
    t.add_column("error", overflow="fold")
    for c in report.cells:
        t.add_row(c.run, c.cell[:10], c.model, c.policy, _budget(c.budget), str(c.chunk), c.task, c.state, c.error,
                  style=_STYLE.get(c.state, ""))
    return t
