"""What a reader sees of a report: its tables as text cells, built once for the terminal, Markdown and HTML.

Every cell is printed by :mod:`kdeval.jobs.reports.render.units`, so the three outputs show the same text. A
column whose value is the same on every row (one model, one chunk size) moves into the title. Views:

* :func:`headline_views` — per model × chunk, policy × budget rows by benchmark columns: the score, and its
  Δ with CI (the first thing the HTML and Markdown reports show);
* :func:`scores_view` — one row per score (task, benchmark average or slice) with Δ, CI and notes;
* :func:`speed_view` — TTFT and decode tokens/s per cell, with ratios and their CIs;
* :func:`memory_view` — prompt length, KV-cache size and the process/GPU peak per cell;
* :func:`cells_view` — the cells not done or missing, with their errors;
* :func:`provenance_view` — the distinct setups (code, libraries, device, host) and the cells of each.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kdeval.evals.task_run.budget import Budget, budget_order
from kdeval.evals.task_run.chunking import chunk_text, is_whole
from kdeval.jobs.reports.report_rows import FULL, CellRow, MetricRow, PerfRow, Report, State, memory_label
from kdeval.jobs.reports.provenance import COMBINATION_KEYS, cell_label, combinations
from kdeval.jobs.reports.render.layout import Column, TableView
from kdeval.jobs.reports.render.units import FEW_MARK, bytes_unit, few_samples_legend, interval, points, text


def metric_label(r: MetricRow) -> str:
    """``ruler.avg``, ``ruler.vt @4096``, ``needle @1024 d25``, ``math500 level 3``."""
    parts = [r.metric]
    if r.length is not None:
        parts.append(f"@{r.length}")
    if r.depth is not None:
        parts.append(f"d{r.depth:g}")
    if r.subset:
        parts.append(r.subset)
    return " ".join(parts)


def budget_text(b: Budget) -> str:
    """``256``, ``25%`` (a share of each prompt) or ``-`` (no budget)."""
    return "-" if b is None else str(b)


def budget_per(layer_kinds: str = "") -> str:
    """Where a budget N's tokens are kept: ``"per layer and KV head"``, or on a model with windowed layers
    (``layer_kinds``, e.g. ``"18 layers: 3 full, 15 sliding 512"``) ``"per full-attention layer and KV head"``."""
    return f"per {'full-attention ' if layer_kinds else ''}layer and KV head"


def windowed_note(layer_kinds: str) -> str:
    """``"18 layers: 3 full, 15 sliding 512; windowed layers keep their window"`` ("" for full layers only); what
    each other kind keeps: a recurrent layer its state (beside the KV cache), a KV-shared layer its source's set."""
    if not layer_kinds:
        return ""
    notes = [("windowed layers keep their window", ("sliding", "chunked")),
             ("recurrent layers keep their state whole, beside the KV cache", ("recurrent",)),
             ("KV-shared layers read their source's kept set", ("shared KV",))]
    kept = [text for text, words in notes if any(w in layer_kinds for w in words)]
    return "; ".join([layer_kinds, *kept])


def budget_note(report: Report, models: list[str]) -> str:
    """For a title over ``models``' rows: ``"; N: tokens per full-attention layer and KV head (<layers>; windowed
    layers keep their window)"`` per model with windowed layers (named when there are several), else ""."""
    hybrid = [m for m in models if report.meta.layer_kinds.get(m)]
    return "".join(f"; N{' on ' + m if len(models) > 1 else ''}: tokens {budget_per(report.meta.layer_kinds[m])} "
                   f"({windowed_note(report.meta.layer_kinds[m])})" for m in hybrid)


def config_label(policy: str, budget: Budget) -> str:
    """``keydiff N=256``, ``keydiff N=25%``; the full cache (no budget) is its policy alone."""
    return policy if budget is None else f"{policy} N={budget}"


class _Shared:
    """Which identity columns are constant over some rows (they go into the title instead)."""

    def __init__(self, rows: list[Any]) -> None:
        self.models = sorted({r.model for r in rows})
        self.chunks = sorted({r.chunk for r in rows})

    @property
    def one_model(self) -> bool:
        return len(self.models) <= 1

    @property
    def one_chunk(self) -> bool:
        return len(self.chunks) <= 1

    def suffix(self) -> str:
        parts = ([self.models[0]] if self.one_model and self.models else []) + (
            [f"B={chunk_text(self.chunks[0])}"] if self.one_chunk and self.chunks else [])
        return f" — {', '.join(parts)}" if parts else ""

    def columns(self) -> list[Column]:
        return ([] if self.one_model else [Column("model", key=True)]) + [Column("policy", key=True),
                                                                           Column("N", numeric=True)] + (
            [] if self.one_chunk else [Column("B", numeric=True)])

    def cells(self, r: Any) -> list[str]:
        return ([] if self.one_model else [r.model]) + [r.policy, budget_text(r.budget)] + (
            [] if self.one_chunk else [chunk_text(r.chunk)])


def _reference(report: Report) -> str:
    return "the full cache" if report.meta.compare == FULL else f"run {report.meta.compare}"


def legend(rows: list[list[str]]) -> str:
    """The caption explaining the few-samples mark, when some cell carries it ('' otherwise)."""
    return few_samples_legend() if any(FEW_MARK in cell for row in rows for cell in row) else ""


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# ------------------------------------------------------------------ scores
def score_note(r: MetricRow) -> str:
    """A score row's state and notes, in words ('' for a plain ok row)."""
    state = "" if r.state == State.OK else r.state
    ref = f"reference {r.ref_state}" if r.ref_state not in (None, State.OK, State.REFERENCE) else ""
    return _join(state, ref, r.note)


def scores_view(report: Report, rows: list[MetricRow] | None = None, title: str | None = None) -> TableView:
    """One row per score: policy, budget, metric, n, score, Δ and its CI, notes (``rows``: a subset)."""
    rows = report.scores if rows is None else rows
    shared = _Shared(rows)
    by_run = report.meta.compare != FULL
    cols = shared.columns() + [Column("metric", key=True), Column("n", numeric=True), Column("score", numeric=True)]
    cols += [Column("reference", numeric=True)] if by_run else []
    cols += [Column(f"Δ [{int(report.meta.confidence * 100)}% CI]", numeric=True), Column("note", fold=True)]
    body = []
    for r in rows:
        ref = [text(r.ref_value, "ref_value")] if by_run else []
        delta = f"{points(r.delta, signed=True)} {interval(r.ci_low, r.ci_high, 'ci_low', r.n_paired)}".strip()
        note = score_note(r)
        if r.ref_state == State.REFERENCE:  # the reference's own row says so where its Δ would be
            delta, note = "reference", "" if r.state == State.OK else r.state
        body.append(shared.cells(r) + [metric_label(r), str(r.n), text(r.value, "value"), *ref, delta, note])
    title = title or (f"scores vs {_reference(report)}{shared.suffix()} (points; Δ paired by sample id)"
                      + budget_note(report, shared.models))
    return TableView("scores", title, cols, body, [r.state for r in rows], list(rows), legend(body))


# ------------------------------------------------------------------ headline
@dataclass(frozen=True)
class HeadlineCell:
    """One score of the headline table: its text, Δ and CI, and whether the CI excludes 0 (``tone``)."""

    score: str
    delta: str = ""
    ci: str = ""
    tone: str = ""        # "worse" | "better" (the CI excludes 0) | "" (it does not, or no delta)
    state: str = State.OK


@dataclass(frozen=True)
class Headline:
    """Per model × chunk: one row per policy × budget, one column per benchmark headline number."""

    title: str
    metrics: list[str]
    rows: list[tuple[str, list[HeadlineCell | None]]]

    def as_table(self) -> TableView:
        """The same table as text cells: ``75.00 (Δ -25.00 [-50.00, 0.00])``."""
        body = []
        for label, cells in self.rows:
            body.append([label] + ["" if c is None else c.score + (f" (Δ {_join_ci(c)})" if c.delta else "")
                                   for c in cells])
        cols = [Column("policy", key=True)] + [Column(m, numeric=True) for m in self.metrics]
        return TableView("headline", self.title, cols, body)


def _join_ci(c: HeadlineCell) -> str:
    return f"{c.delta} {c.ci}".strip()


def headline_rows(scores: list[MetricRow]) -> list[MetricRow]:
    """The one number per benchmark of each configuration: its average over tasks where the report has one,
    else the task's own score (one task of an averaged benchmark, or a benchmark that is one task)."""
    averaged = {(r.model, r.chunk, r.benchmark) for r in scores if r.level == "benchmark"}
    return [r for r in scores if r.level == "benchmark"
            or (r.level == "task" and (r.model, r.chunk, r.benchmark) not in averaged)]


def _tone(r: MetricRow) -> str:
    if r.delta is None or r.ci_low is None or r.ci_high is None:
        return ""
    return "worse" if r.ci_high < 0 else "better" if r.ci_low > 0 else ""


def headline_views(report: Report) -> list[Headline]:
    """The headline tables, one per model × chunk (the reference's rows first, then by policy and budget)."""
    groups: dict[tuple[str, int], list[MetricRow]] = {}
    for r in headline_rows(report.scores):
        groups.setdefault((r.model, r.chunk), []).append(r)
    out = []
    for (model, chunk), rows in sorted(groups.items()):
        metrics = sorted({r.metric for r in rows})
        configs = sorted({(r.policy, r.budget) for r in rows},
                         key=lambda c: (c[0] != FULL, c[0], budget_order(c[1])))
        at = {(r.policy, r.budget, r.metric): r for r in rows}
        table = []
        for policy, budget in configs:
            cells: list[HeadlineCell | None] = []
            for m in metrics:
                r = at.get((policy, budget, m))
                if r is None:
                    cells.append(None)
                    continue
                score = text(r.value, "value") if r.value is not None else r.state
                cells.append(HeadlineCell(score, points(r.delta, signed=True),
                                          interval(r.ci_low, r.ci_high, "ci_low", r.n_paired), _tone(r), r.state))
            table.append((config_label(policy, budget), cells))
        out.append(Headline(f"{model}, B={chunk_text(chunk)}: points, Δ vs {_reference(report)} "
                            f"[{int(report.meta.confidence * 100)}% CI]{budget_note(report, [model])}",
                            metrics, table))
    return out


# ------------------------------------------------------------------ speed and memory
def _ratio(value: float | None, low: float | None, high: float | None, n: int) -> str:
    if value is None:
        return ""
    return f"{text(value, 'ttft_ratio')} {interval(low, high, 'ttft_ratio', n)}".strip()


def _is_reference(report: Report, p: PerfRow) -> bool:
    return report.meta.compare == FULL and p.policy == FULL


def speed_view(report: Report) -> TableView:
    """Median TTFT and decode tokens/s per cell, with their ratios to the reference and the ratios' CIs."""
    rows = report.perf
    shared = _Shared(rows)
    cols = shared.columns() + [Column("task", key=True), Column("n", numeric=True), Column("TTFT s", numeric=True),
                               Column("TTFT ×", numeric=True), Column("decode tok/s", numeric=True),
                               Column("tok/s ×", numeric=True), Column("note", fold=True)]
    # a note every cell has (which samples were timed, "too noisy to rank ...") is said once in the title, each
    # of its parts on its own: every cell but the reference may share a part the reference cannot have
    parts = [[x for x in [p.speed_note, *p.timed_note.split("; ")] if x] for p in rows]
    compared = [n for p, n in zip(rows, parts) if not _is_reference(report, p)]
    everyone = _common_parts(parts)
    but_reference = [x for x in _common_parts(compared) if x not in everyone] if len(compared) < len(rows) else []
    said = set(everyone) | set(but_reference)
    # a part many (not all) cells have is numbered, and said once under the table
    counts = Counter(x for n in parts for x in n if x not in said)
    marks = {x: f"[{k}]" for k, x in enumerate((x for x, n in counts.items() if n >= FOOTNOTE_AT), start=1)}
    body = []
    for p, own in zip(rows, parts):
        note = _join("" if p.state == State.OK else p.state, "reference" if _is_reference(report, p) else "",
                     *[marks.get(x, x) for x in own if x not in said])
        body.append(shared.cells(p) + [p.task, str(p.n), text(p.ttft_median_s, "ttft_median_s"),
                                       _ratio(p.ttft_ratio, p.ttft_ratio_low, p.ttft_ratio_high, p.n_paired),
                                       text(p.decode_tok_s, "decode_tok_s"),
                                       _ratio(p.decode_ratio, p.decode_ratio_low, p.decode_ratio_high, p.n_paired),
                                       note])
    title = (f"speed per cell vs {_reference(report)}{shared.suffix()} (medians over samples; × = this / "
             f"reference over the paired samples, {int(report.meta.confidence * 100)}% bootstrap CI)"
             + (f"; every cell: {'; '.join(everyone)}" if everyone else "")
             + (f"; every cell but the reference: {'; '.join(but_reference)}" if but_reference else ""))
    caption = "; ".join([x for x in (legend(body),) if x] + [f"{m} {x}" for x, m in marks.items()])
    return TableView("speed", title, cols, body, [p.state for p in rows], list(rows), caption)


#: a speed note that this many cells share (not all) is numbered in the rows and said once in the caption
FOOTNOTE_AT = 3


def _common_parts(notes: list[list[str]]) -> list[str]:
    """The parts every one of ``notes`` has, in the first's order (none for fewer than two notes)."""
    if len(notes) < 2:
        return []
    return [x for x in notes[0] if all(x in n for n in notes[1:])]


def _peak_header(rows: list[PerfRow]) -> tuple[str, bool]:
    """The process/GPU peak column's label, and whether each value needs its own kind (mixed kinds)."""
    kinds = {p.memory_kind for p in rows if p.peak_memory_bytes is not None}
    if len(kinds) == 1:
        return memory_label(kinds.pop()), False
    return "process/GPU peak", len(kinds) > 1


def memory_view(report: Report) -> TableView:
    """Per cell: prompt tokens, peak KV tokens and bytes, "mem ×" (peak KV-cache bytes over the reference's),
    and the process/GPU peak under the label of what it measures."""
    rows = report.perf
    shared = _Shared(rows)
    kv_unit, kv_div = bytes_unit([p.peak_kv_bytes for p in rows])
    peak_unit, peak_div = bytes_unit([p.peak_memory_bytes for p in rows])
    peak, per_row = _peak_header(rows)
    states = any(p.state_bytes for p in rows)  # a recurrent hybrid's states, beside the KV cache
    state_unit, state_div = bytes_unit([p.state_bytes for p in rows]) if states else ("", 1)
    cols = shared.columns() + [Column("task", key=True), Column("prompt tokens", numeric=True),
                               Column("peak KV tokens", numeric=True), Column(f"KV-cache {kv_unit}", numeric=True),
                               Column("mem ×", numeric=True)] + (
        [Column(f"states {state_unit}", numeric=True), Column("policy's share", numeric=True)] if states else []
    ) + [Column(f"{peak} {peak_unit}", numeric=True)]
    body = []
    for p in rows:
        mem = text(p.peak_memory_bytes, "peak_memory_bytes", peak_div)
        if per_row and mem:
            mem += f" ({memory_label(p.memory_kind)})"
        mem_x = "" if _is_reference(report, p) else "-" if p.kv_bytes_ratio is None else text(p.kv_bytes_ratio,
                                                                                             "kv_bytes_ratio")
        own = [text(p.state_bytes or 0, "peak_kv_bytes", state_div),
               f"{p.peak_kv_bytes / (p.peak_kv_bytes + (p.state_bytes or 0)):.0%}" if p.peak_kv_bytes else ""
               ] if states else []
        body.append(shared.cells(p) + [p.task, text(p.prompt_tokens, "prompt_tokens"),
                                       text(p.peak_kv_tokens, "peak_kv_tokens"),
                                       text(p.peak_kv_bytes, "peak_kv_bytes", kv_div), mem_x, *own, mem])
    title = (f"memory per cell{shared.suffix()} (mem × = peak KV-cache bytes / {_reference(report)}'s; "
             f"the {peak} includes the weights)")
    if states:
        title += ("; states: the recurrent layers' conv and recurrent states, constant in length and kept whole "
                  "beside the KV cache; policy's share: the KV cache's part of the two")
    if any(is_whole(p.chunk) for p in rows):
        title += "; B=whole: unbounded, the cache holds all that is compressed before its one eviction"
    return TableView("memory", title, cols, body, [p.state for p in rows], list(rows))


# ------------------------------------------------------------------ cells
def cells_view(report: Report) -> TableView | None:
    """Cells that failed, have not run, whose result file is not intact, or are missing (None when none)."""
    if not report.cells:
        return None
    rows: list[CellRow] = report.cells
    shared = _Shared(rows)
    cols = [Column("run", key=True), Column("cell", key=True)] + shared.columns() + [
        Column("task", key=True), Column("state"), Column("error", fold=True)]
    body = [[c.run, c.cell[:10]] + shared.cells(c) + [c.task, c.state, c.error] for c in rows]
    return TableView("cells", f"cells not done or missing{shared.suffix()}", cols, body,
                     [c.state for c in rows], list(rows))


# ------------------------------------------------------------------ provenance
def provenance_view(report: Report) -> TableView | None:
    """One row per distinct setup: how many cells ran on it, its versions, device and host, and which cells."""
    if not report.provenance:
        return None
    body = [[str(len(members))] + [setup[k] or "-" for k in COMBINATION_KEYS]
            + [", ".join(cell_label(r) for r in members)] for setup, members in combinations(report.provenance)]
    cols = [Column("cells", numeric=True)] + [Column(k) for k in COMBINATION_KEYS] + [Column("which", fold=True)]
    return TableView("setups", "setups the compared cells ran on", cols, body, [""] * len(body))
