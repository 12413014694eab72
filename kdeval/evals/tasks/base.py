"""The task interface: samples, scores, errors, stable ids and prompt hashes.

A *task* is one benchmark subset (``longbench.hotpotqa``, ``ruler.niah_single_1``, ``needle`` ...).
It yields :class:`Sample` objects, scores one prediction with :meth:`Task.score`, and turns the
per-sample rows of a run into headline numbers with :meth:`Task.aggregate`.

A sample's user message is ``prefix + suffix``: ``prefix`` ends with the (long) context and
``suffix`` holds the question, so samples whose prefix is the same can share one compressed
context. ``answer_prefix`` is text the assistant turn starts with (RULER's "Answer: ...").
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

JSONScalar = str | int | float | bool | None


class EvalError(ValueError):
    """Base class of every error the evaluation suites raise on bad input."""


class UnknownTaskError(EvalError, KeyError):
    """A task name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataNotFoundError(EvalError, FileNotFoundError):
    """A data file the task needs is missing (the message says which and how to get it)."""


class TaskUnavailableError(EvalError):
    """The task cannot run here (e.g. a hub dataset while offline); callers may skip it."""


class ContextTooLongError(EvalError):
    """A requested length does not fit the model's context."""


@dataclass(frozen=True)
class Followup:
    """A later question on a sample's context (turn 2, 3, ... of a conversation).

    Attributes:
        suffix: the question as it would follow the context in a first message (a multi-request turn's
            question; a multi-turn conversation sends it, stripped, as its own user message).
        references: acceptable answers of this turn.
        meta: what the metric needs for this turn, over the sample's ``meta``.
    """

    suffix: str
    references: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.suffix.strip():
            raise EvalError("Followup.suffix must be a non-empty question")
        if isinstance(self.references, (str, bytes)) or not self.references:
            raise EvalError("Followup.references must be a non-empty sequence of strings")
        object.__setattr__(self, "references", tuple(str(r) for r in self.references))


@dataclass(frozen=True)
class Sample:
    """One evaluation item.

    Attributes:
        id: stable identifier, equal across runs, models and policies (pairs items).
        prefix: start of the user message, ending with the long context (shareable part).
        suffix: rest of the user message (the question); may be empty.
        references: acceptable answers; the metric takes the best over them.
        max_new_tokens: generation length the benchmark prescribes.
        answer_prefix: text placed after the chat template's assistant header.
        use_chat_template: False when the benchmark says raw completion (e.g. LongBench trec).
        meta: what the metric or the aggregate needs (``all_classes``, ``length``, ``depth``...).
        followups: the later questions on this context, in order (tasks with several questions per context:
            ``suffix`` and ``references`` are turn 1's); empty for one question.
        turn_lengths: each turn's own generation length where a context's turns differ (SCBench's mixed tasks),
            each capped by ``max_new_tokens`` (which the prompt reserves room for); empty: every turn
            ``max_new_tokens``.
        system: a system prompt (the chat template's system message; without a template, text before the user
            message); part of the prefix's tokens, never truncated. Empty: the template's own default.
    """

    id: str
    prefix: str
    suffix: str
    references: tuple[str, ...]
    max_new_tokens: int
    answer_prefix: str = ""
    use_chat_template: bool = True
    meta: Mapping[str, Any] = field(default_factory=dict)
    followups: tuple[Followup, ...] = ()
    turn_lengths: tuple[int, ...] = ()
    system: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            raise EvalError("Sample.id must be a non-empty string")
        if self.max_new_tokens < 1:
            raise EvalError(f"Sample.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.references, (str, bytes)):
            raise EvalError("Sample.references must be a sequence of strings, not one string")
        object.__setattr__(self, "references", tuple(str(r) for r in self.references))
        object.__setattr__(self, "followups", tuple(self.followups))
        object.__setattr__(self, "turn_lengths", tuple(int(n) for n in self.turn_lengths))
        if self.turn_lengths and (len(self.turn_lengths) != self.turns or min(self.turn_lengths) < 1):
            raise EvalError(f"Sample.turn_lengths: expected {self.turns} lengths >= 1 (one per turn), got "
                            f"{list(self.turn_lengths)}")

    @property
    def turns(self) -> int:
        """Questions asked on this context (1 + the followups)."""
        return 1 + len(self.followups)

    def turn(self, t: int) -> "Sample":
        """The sample of turn ``t`` (1-based) as a one-question sample: its question, references and meta
        (the context, answer prefix and generation length are the sample's)."""
        if not 1 <= t <= self.turns:
            raise EvalError(f"turn: expected 1 .. {self.turns} for sample {self.id!r}, got {t}")
        lengths = (self.new_tokens(t),) if self.turn_lengths else ()
        if t == 1:
            return dataclasses.replace(self, followups=(), turn_lengths=lengths)
        f = self.followups[t - 2]
        return dataclasses.replace(self, suffix=f.suffix, references=f.references,
                                   meta={**self.meta, **f.meta}, followups=(), turn_lengths=lengths)

    def new_tokens(self, t: int = 1) -> int:
        """Tokens turn ``t`` (1-based) may generate: its own length, at most ``max_new_tokens``."""
        if not 1 <= t <= self.turns:
            raise EvalError(f"new_tokens: expected a turn in 1 .. {self.turns} for sample {self.id!r}, got {t}")
        return min(self.turn_lengths[t - 1], self.max_new_tokens) if self.turn_lengths else self.max_new_tokens


@dataclass(frozen=True)
class ScoreResult:
    """The score of one prediction: ``score`` in [0, 1] and named sub-scores."""

    score: float
    sub: Mapping[str, float] = field(default_factory=dict)


def prompt_hash(token_ids: Sequence[int]) -> str:
    """sha256 (first 16 hex digits) of the exact token ids fed to the model."""
    h = hashlib.sha256()
    h.update(",".join(str(int(t)) for t in token_ids).encode("ascii"))
    return h.hexdigest()[:16]


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for an empty input."""
    vals = list(values)
    return math.fsum(vals) / len(vals) if vals else float("nan")


def percent(values: Iterable[float]) -> float:
    """``round(100 * mean, 2)``: the headline form of per-sample scores in [0, 1]."""
    return round(100 * mean(values), 2)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise an :class:`EvalError` naming ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        expected = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise EvalError(f"{name}: expected {expected}, got {value!r}")


def check_positive(name: str, value: Any, allow_none: bool = False) -> None:
    """Raise an :class:`EvalError` naming ``name`` unless ``value`` is an integer >= 1 (or None if allowed)."""
    if value is None and allow_none:
        return
    if value is None or value < 1:
        raise EvalError(f"{name}: expected a positive integer{' or None' if allow_none else ''}, got {value}")


class Task(ABC):
    """One benchmark subset. Subclasses are dataclasses whose fields are the task's parameters.

    Every instance has a ``name`` (its registry name). What ``kdeval tasks`` lists (benchmark,
    metric, data source) lives in the registry's TaskSpec.
    """

    name: str

    #: False when the prompt has no question apart from its context (the whole prompt is the question):
    #: such a task refuses ``protocol: {compress: context}``.
    separable_question: bool = True

    #: True for tasks that ask several questions per context (their samples carry ``followups``): they run as
    #: conversations (:mod:`kdeval.evals.task_run.conversation`), and only they do.
    multi_question: bool = False

    #: generation length for reasoning models (``generation: {thinking: strip}`` without a grid length), where the
    #: benchmark's evaluation of such models sets one (MATH-500, AIME); None: the task's own length.
    reasoning_max_new_tokens: int | None = None

    @abstractmethod
    def samples(self, builder: Any = None) -> list[Sample]:
        """The task's samples; synthetic tasks size them with ``builder`` (a PromptBuilder)."""

    @abstractmethod
    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """Score one prediction against its references (``meta`` as in :class:`Sample`)."""

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Headline numbers from per-sample rows (default: 100 x mean score, rounded to 2)."""
        return {"score": percent(float(r["score"]) for r in rows), "n": len(rows)}

    def generation_length(self) -> int:
        """The generation length the benchmark prescribes (tokens), used unless the grid sets one."""
        return int(getattr(self, "max_new_tokens"))

    def sample_ids(self) -> list[str] | None:
        """The ids :meth:`samples` yields, in order, computed without a tokenizer (cell identity);
        None when they cannot be known before the data is fetched (hub sources)."""
        return [s.id for s in self.samples()]

    def data_files(self) -> list[tuple[str, Any]]:
        """``(name relative to the data directory, path)`` of every file the samples are read from."""
        return []

    def data_source(self) -> str:
        """Where the samples come from, in words that do not depend on the machine (dry runs, cell identity)."""
        return "synthetic"

    def check_context(self, max_context: int) -> None:
        """Raise :class:`ContextTooLongError` when the task asks for more than ``max_context``."""

    def params(self) -> dict[str, Any]:
        """The task's parameters (its dataclass fields) as JSON-able values."""
        if not dataclasses.is_dataclass(self):
            return {}
        out = {}
        for f in dataclasses.fields(self):
            if f.name.startswith("_"):
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else (str(v) if hasattr(v, "__fspath__") else v)
        return out


def group_mean(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], value: str) -> dict[str, float]:
    """Mean of ``value`` per combination of ``keys``, as ``{"k1=v1,k2=v2": mean}``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        label = ",".join(f"{k}={row_field(r, k)}" for k in keys)
        groups[label].append(float(r[value]))
    return {k: mean(v) for k, v in sorted(groups.items())}


def group_percent(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], value: str = "score") -> dict[str, float]:
    """:func:`group_mean` in headline form (``round(100 * mean, 2)`` per group)."""
    return {k: round(100 * v, 2) for k, v in group_mean(rows, keys, value).items()}


def row_field(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, else the key in the row's ``meta`` dict or ``meta_json`` text, else None."""
    if row.get(key) is not None:
        return row[key]
    meta = row.get("meta") or row.get("meta_json") or {}
    if isinstance(meta, str):
        meta = json.loads(meta)
    return meta.get(key)
