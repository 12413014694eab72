"""The report's result schema: typed rows of three tables, and the report that holds them.

* :class:`MetricRow` — one score: a task (``level="task"``), a benchmark headline such as
  ``ruler.avg`` (``"benchmark"``) or a slice of one (``"detail"``: a length, a needle depth, a
  LongBench-E bucket, a Math-500 level), for one model × policy × budget × chunk. Scores are in
  points (100 × mean per-sample score); ``delta`` is paired by sample id against the reference
  (the ``full`` cell, or the same cell of another run), with a bootstrap CI.
* :class:`PerfRow` — speed and memory of one cell (one task instance: task, length, seed).
* :class:`CellRow` — every cell that is not done (failed, pending, running), whose result file fails
  its integrity check, or is missing: shown, never dropped.
* :class:`ProvenanceRow` — where and with what code each compared cell ran (versions, device, host).
* :class:`TurnRow` — a conversation's score at one turn, against the reference and against its turn 1.
* :class:`BrokenRow` — a sample the reference answers and a policy does not (both predictions, the gold).
* :class:`LengthRow` — generated tokens of a cell against the reference's, paired by sample.

Rows hold numbers unrounded (:func:`stored`): JSON and CSV keep every digit and parse
back to equal rows (:func:`row_from_dict`); the terminal, Markdown and HTML round when they print
(:func:`~kdeval.jobs.reports.render.units.text`).
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kdeval.evals.task_run.budget import Budget, parse_budget


def stored(value: Any) -> float | int | None:
    """``value`` as a report row holds it: None for None and NaN, an integer as ``int``, any other number as
    ``float``, unrounded."""
    if value is None or value != value:
        return None
    return int(value) if isinstance(value, numbers.Integral) else float(value)

#: The full-cache policy: the default reference of a report.
FULL = "full"


class State:
    """Row states (plain strings so that every output format carries them as they are)."""

    OK = "ok"                # every cell of the group is done
    PARTIAL = "partial"      # some cells done, others failed/pending: numbers from the done ones
    FAILED = "failed"        # no cell done, at least one failed
    PENDING = "pending"      # no cell done yet, none failed
    MISSING = "missing"      # not in this run (the reference has it), or no reference cell at all
    REFERENCE = "reference"  # ref_state of the full cache's own rows (they are the reference)


@dataclass(frozen=True)
class MetricRow:
    """One score of one configuration, with its paired delta against the reference."""

    level: str                 # "task" | "benchmark" | "detail"
    benchmark: str             # "ruler", "longbench", "needle", "math500", "phonebook" (or the task name)
    metric: str                # task name ("ruler.vt") or headline ("ruler.avg")
    model: str
    policy: str                # policy name, with its params when it has any: "sink(n_sink_tokens=8)"
    budget: Budget             # N, a share of the prompt ("25%"), None for the full cache
    chunk: int
    length: int | None = None  # slice: target prompt length
    depth: float | None = None  # slice: needle depth (%)
    subset: str | None = None  # slice: "0-4k" (LongBench-E), "level 3" (Math-500)
    state: str = State.OK
    n: int = 0                 # samples behind ``value``
    value: float | None = None  # points
    ref_state: str | None = None  # state of the reference group ("ok", "failed", "missing", ...)
    ref_value: float | None = None  # the reference's value (all of its samples)
    n_paired: int = 0          # samples present in both (the delta's sample)
    n_dropped: int = 0         # samples present in only one of the two (left out of the delta)
    delta: float | None = None  # mean paired difference, this − reference (points)
    ci_low: float | None = None
    ci_high: float | None = None
    note: str = ""


@dataclass(frozen=True)
class PerfRow:
    """Speed and memory of one cell, and their ratio to the reference cell.

    Speed ratios are ratios of medians over the samples present in both cells (``n_paired``), with a
    bootstrap CI over those samples (TTFT: over batch timings, one per batch); ``speed_note`` says when they
    cannot rank the two (CI spanning 1.0, one sample, one batch timing)."""

    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str                  # task instance label, e.g. "needle@1024#s0"
    state: str = State.OK
    n: int = 0
    prompt_tokens: int | None = None    # median prompt length (tokens)
    ttft_median_s: float | None = None
    decode_tok_s: float | None = None   # median over samples of generated tokens / decode seconds
    peak_kv_bytes: int | None = None    # max over samples of the bytes of K/V the cache held (None: old rows)
    peak_kv_tokens: int | None = None
    #: bytes of the recurrent layers' states (beside the KV cache, not the policy's; None: old rows, 0: none)
    state_bytes: int | None = None
    peak_memory_bytes: int | None = None  # process/GPU peak, max over samples (the cell's, when rows lack it)
    memory_kind: str = ""               # what peak_memory_bytes measures: MEMORY_KINDS key, "" when unknown
    model_weight_bytes: int | None = None  # the model's weights (included in a cuda_max_allocated peak)
    n_paired: int = 0                   # samples timed in both cells (the speed ratios' sample)
    ttft_ratio: float | None = None     # this / reference (median TTFT, one timing per batch)
    ttft_ratio_low: float | None = None  # its CI
    ttft_ratio_high: float | None = None
    decode_ratio: float | None = None   # this / reference (median decode tokens/s over the paired samples)
    decode_ratio_low: float | None = None
    decode_ratio_high: float | None = None
    speed_note: str = ""                # "too noisy to rank ..." when a speed ratio's CI spans 1.0
    timed_note: str = ""                # which samples TTFT comes from, when some were computed with shared steps
    kv_bytes_ratio: float | None = None  # peak KV-cache bytes / the reference's: the report's "mem ×"
    kv_ratio: float | None = None       # peak KV tokens / the reference's


@dataclass(frozen=True)
class CellRow:
    """A cell that is not done, or is missing from this run: shown as such."""

    run: str                   # the run that holds the cell, or that lacks it (state "missing")
    cell: str                  # cell id ("" for a missing one)
    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str
    state: str                 # failed (also: done but its result file fails its check) | pending | running | missing
    error: str = ""


@dataclass(frozen=True)
class ProvenanceRow:
    """Where and with what code one compared cell ran ("" where the index recorded nothing)."""

    run: str
    cell: str
    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str
    kdeval_version: str = ""
    source_hash: str = ""
    torch: str = ""
    transformers: str = ""
    cuda: str = ""
    device: str = ""
    dtype: str = ""
    attn_implementation: str = ""
    host: str = ""


@dataclass(frozen=True)
class ContrastRow:
    """Two settings of one policy × budget × task in the same runs, paired by sample: ``a − b`` in points.

    ``cost_of_chunking``: ``a`` is chunked prefill at B = ``a_label`` and ``b`` one-shot (chunk size ``whole``),
    under one protocol; ``query_dependence``: ``a`` is query-aware (``compress: prompt``) and ``b``
    query-agnostic (``compress: context``), at one chunk size. Beside the delta, each side's peak KV-cache bytes
    (max over samples) and median TTFT (seconds)."""

    model: str
    policy: str                # policy label, without the protocol
    budget: Budget
    task: str                  # registry task name (its lengths and seeds pooled; pairs never cross them)
    setting: str               # what both sides share: "query-aware", "B=128", "B=128, decode keep" ...
    a_label: str               # "B=128" / "query-aware"
    b_label: str               # "whole" / "query-agnostic"
    state: str = State.OK
    n_paired: int = 0
    n_dropped: int = 0         # samples on one side only (left out)
    a_value: float | None = None  # points, over the paired samples
    b_value: float | None = None
    delta: float | None = None  # mean paired difference a − b (points)
    ci_low: float | None = None
    ci_high: float | None = None
    a_kv_bytes: int | None = None
    b_kv_bytes: int | None = None
    a_ttft_s: float | None = None
    b_ttft_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class TurnRow:
    """The score of one turn of a conversation for one cell configuration (policy × budget × chunk × task
    instance): against the reference's same turn (``delta``, paired by sample) and against its own turn 1
    (``decay`` = turn t − turn 1, paired by sample; 0-width at turn 1)."""

    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str                  # task instance label, with its conversation tag ("turns.kv@2048#s0 [multi-request]")
    turn: int
    state: str = State.OK
    n: int = 0
    value: float | None = None  # points
    ref_value: float | None = None
    n_paired: int = 0
    delta: float | None = None  # this − reference at this turn (points)
    ci_low: float | None = None
    ci_high: float | None = None
    decay: float | None = None  # turn t − turn 1 of this configuration (points, paired by sample)
    decay_low: float | None = None
    decay_high: float | None = None
    note: str = ""


@dataclass(frozen=True)
class BrokenRow:
    """A sample (one turn of it, in a conversation) the reference answers and a policy does not: the reference's
    score passes (>= 0.5) and this policy's does not (< 0.5)."""

    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str                  # task instance label
    id: str                    # sample id
    turn: int = 0              # 0: not a conversation
    score: float | None = None  # this policy's score in [0, 1]
    ref_score: float | None = None
    prediction: str = ""
    ref_prediction: str = ""
    gold: str = ""             # the first reference answer


@dataclass(frozen=True)
class LengthRow:
    """Answer length of one cell against the reference's: generated tokens paired by sample (and turn), what a
    solved problem cost in decode tokens, and how many traces hit ``max_new_tokens`` (reasoning under
    ``compress: generated``: low budgets make traces longer)."""

    model: str
    policy: str
    budget: Budget
    chunk: int
    task: str
    state: str = State.OK
    n_paired: int = 0
    tokens: float | None = None       # mean generated tokens over the paired samples
    ref_tokens: float | None = None
    delta: float | None = None        # mean paired difference, this − reference (tokens)
    ci_low: float | None = None
    ci_high: float | None = None
    ratio: float | None = None        # tokens / ref_tokens
    #: decode tokens per solved problem: generated tokens of all paired samples / those answered (score >=
    #: 0.5); None when none is
    per_solved: float | None = None
    ref_per_solved: float | None = None
    #: share of the paired samples whose generation stopped at max_new_tokens (a cut-off trace); None when the
    #: rows do not record it
    capped: float | None = None
    ref_capped: float | None = None
    note: str = ""


@dataclass(frozen=True)
class FrontierRow:
    """One configuration (policy × budget × chunk × KV store) of one model × task on the accuracy-per-KV-byte
    plane: its score and peak KV-cache bytes (lengths and seeds of the task pooled), whether it is on the Pareto
    frontier (no other configuration scores at least as much with at most its bytes) or ``dominated`` (then by
    whom), and, on the frontier, the margin over the best other configuration within its bytes (paired by
    sample). Rows exist for a model × task whose cells include a quantized KV store (``kv_quant``)."""

    model: str
    task: str                  # registry task name
    policy: str                # policy label, with its protocol and store tags
    budget: Budget
    chunk: int
    kv_bits: int | None = None  # bits per stored number (None: the model's own width)
    state: str = State.OK
    n: int = 0
    value: float | None = None  # points
    kv_bytes: int | None = None  # peak KV-cache bytes, max over samples
    position: str = ""         # "frontier" | "dominated" | "" (no score or bytes)
    dominated_by: str = ""     # a frontier configuration with at most these bytes and at least this score
    runner_up: str = ""        # frontier rows: the best other configuration with at most these bytes
    n_paired: int = 0
    delta: float | None = None  # this − runner_up (points, paired by sample)
    ci_low: float | None = None
    ci_high: float | None = None
    note: str = ""

    @property
    def config(self) -> str:
        """How the other rows name this one: ``keydiff [kivi-4b-g32-w128] N=512 B=128``."""
        budget = "" if self.budget is None else f" N={self.budget}"
        return f"{self.policy}{budget} B={self.chunk}"


@dataclass(frozen=True)
class ReportMeta:
    """What the report compares and how."""

    runs: list[str]
    compare: str               # "full" or the reference run id
    resamples: int
    seed: int
    confidence: float
    created: str               # ISO-8601 UTC
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # one line each: e.g. cells ran on different devices
    #: model -> its layers by kind, for each model with windowed (sliding/chunked) layers: its budget N counts
    #: tokens per full-attention layer and KV head ("18 layers: 3 full, 15 sliding 512")
    layer_kinds: dict[str, str] = field(default_factory=dict)

    @property
    def method(self) -> str:
        """How deltas and their CIs are computed (one line of the Markdown and HTML headers)."""
        return (f"this − reference in points, paired by sample id; {int(self.confidence * 100)}% CI by paired "
                f"bootstrap ({self.resamples} resamples, seed {self.seed})")


@dataclass(frozen=True)
class Report:
    """Everything ``kdeval report`` prints or writes."""

    meta: ReportMeta
    scores: list[MetricRow]
    perf: list[PerfRow]
    cells: list[CellRow]
    provenance: list[ProvenanceRow] = field(default_factory=list)
    cost_of_chunking: list[ContrastRow] = field(default_factory=list)  # chunked − one-shot, when a run has both
    query_dependence: list[ContrastRow] = field(default_factory=list)  # query-aware − query-agnostic, likewise
    turns: list[TurnRow] = field(default_factory=list)  # score by turn, when a run holds conversations
    query_dependence_by_turn: list[ContrastRow] = field(default_factory=list)  # query dependence per turn
    broken: list[BrokenRow] = field(default_factory=list)  # samples the reference answers and a policy does not
    answer_length: list[LengthRow] = field(default_factory=list)  # generated tokens vs the reference's
    kv_frontier: list[FrontierRow] = field(default_factory=list)  # accuracy per KV byte, when a run quantizes

    @property
    def n_incomplete_cells(self) -> int:
        """Cells of the reported runs not done (failed, pending, running) or missing; exit 1 when any."""
        return sum(1 for c in self.cells if c.run in self.meta.runs)


RowT = TypeVar("RowT", MetricRow, PerfRow, CellRow, ProvenanceRow, ContrastRow, TurnRow, BrokenRow, LengthRow,
               FrontierRow)
TABLES: dict[str, type] = {"scores": MetricRow, "perf": PerfRow, "cells": CellRow, "provenance": ProvenanceRow,
                           "cost_of_chunking": ContrastRow, "query_dependence": ContrastRow, "turns": TurnRow,
                           "query_dependence_by_turn": ContrastRow, "broken": BrokenRow,
                           "answer_length": LengthRow, "kv_frontier": FrontierRow}

#: What ``PerfRow.peak_memory_bytes`` measures, by ``memory_kind``: the label tables print for it.
MEMORY_KINDS: dict[str, str] = {"process_rss": "process peak (RSS)", "cuda_max_allocated": "GPU peak incl. weights"}


def memory_label(kind: str) -> str:
    """How a table labels a process/GPU peak of ``kind`` ("peak memory" when unknown)."""
    return MEMORY_KINDS.get(kind, "peak memory")


def _coerce(text: Any, annotation: str) -> Any:
    """A field value read back from text (CSV/Markdown/HTML cells) or JSON."""
    if text is None or text == "":
        return "" if annotation == "str" else None
    if annotation == "Budget":
        return parse_budget(text)  # "256" -> 256, "25%" stays a share
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("float"):
        return float(text)
    return str(text)


def row_from_dict(cls: type[RowT], data: dict[str, Any]) -> RowT:
    """The row of type ``cls`` from a dict of (possibly text) values; unknown keys are an error."""
    names = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = set(data) - set(names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown columns {sorted(unknown)}")
    return cls(**{k: _coerce(v, names[k]) for k, v in data.items()})


def format_value(value: Any) -> str:
    """How CSV (and the HTML rows' raw data) carry a value: '' for None, else ``str`` (a float's shortest
    repr, which parses back to the same number)."""
    return "" if value is None else str(value)
