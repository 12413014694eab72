"""Needle-in-a-haystack: a grid of context lengths x needle depths (heatmap output).

Haystack: Paul Graham essays (``<data dir>/haystack/PaulGrahamEssays.json``), or, when they are
absent (``haystack="auto"``) or asked for (``"noise"``), a synthetic noise haystack of repeated
simple sentences. The needle is the classic "best thing to do in San Francisco" sentence, placed
at ``depth`` percent of the context (moved back to a sentence end when one is within 2% of the
context, else to a word boundary). Lengths follow :mod:`kdeval.evals.tasks.synthetic`.

Score: 1 when the normalized answer appears in the prediction; sub-score ROUGE-L recall.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kdeval.evals.metrics.text import contains_answer, rouge_l_recall
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, check_choice, check_positive, percent, row_field
from kdeval.evals.tasks.synthetic import (ESSAY_FILE, NOISE_SENTENCES, SyntheticTask, check_lengths, essay_path, essay_words,
                                    fit_units, take_words)

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "What is the best thing to do in San Francisco?"
ANSWER = "eat a sandwich and sit in Dolores Park on a sunny day"
INTRO = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct.\n\n<document>\n"
QUESTION_SUFFIX = "\n</document>\n\nQuestion: " + QUESTION + " Don't give information outside the document or repeat your findings."
ANSWER_PREFIX = "The best thing to do in San Francisco is"


def insert_at_depth(text: str, needle: str, depth: float) -> tuple[str, int]:
    """Insert ``needle`` at ``depth`` percent of ``text``; returns (new text, needle char index)."""
    if depth <= 0:
        return needle + " " + text, 0
    if depth >= 100:
        return text + " " + needle, len(text) + 1
    target = int(len(text) * depth / 100)
    window = max(1, len(text) // 50)
    cut = text.rfind(". ", max(0, target - window), target + 1)
    if cut >= 0:
        cut += 2  # after ". "
    else:
        cut = text.rfind(" ", 0, target + 1) + 1  # word boundary (0 when none)
    return text[:cut] + needle + " " + text[cut:], cut


def _depth_label(depth: float) -> int | float:
    """A depth as ids and rows show it: ``25`` rather than ``25.0``."""
    return int(depth) if float(depth).is_integer() else depth


def _sample_id(length: int, depth: float) -> str:
    return f"needle/L{length}/D{_depth_label(depth)}"


@dataclass
class NeedleTask(SyntheticTask):
    """Needle in a haystack over ``lengths`` x ``depths``.

    Args:
        lengths: target lengths in tokens (prompt + max_new_tokens).
        depths: needle depths in percent of the context (0 = start, 100 = end).
        haystack: ``"auto"`` (essays when present, else noise), ``"essay"`` or ``"noise"``.
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        max_new_tokens: generation length.
    """

    lengths: Sequence[int] = (1024, 2048, 4096)
    depths: Sequence[float] = (0, 25, 50, 75, 100)
    haystack: str = "auto"
    data_dir: str | None = None
    max_new_tokens: int = 32
    _words: list[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = "needle"
        self.lengths = check_lengths(self.lengths)
        self.depths = tuple(float(d) for d in ([self.depths] if isinstance(self.depths, (int, float)) else self.depths))
        if not self.depths or any(d < 0 or d > 100 for d in self.depths):
            raise EvalError(f"depths: expected percentages in [0, 100], got {list(self.depths)}")
        check_choice("haystack", self.haystack, ("auto", "essay", "noise"))
        check_positive("max_new_tokens", self.max_new_tokens)
        if self.haystack != "noise":
            self._words = essay_words(self.data_dir, required=self.haystack == "essay")

    @property
    def haystack_used(self) -> str:
        """``"essay"`` or ``"noise"``: the haystack the samples are built from."""
        return "essay" if self._words is not None else "noise"

    def _units(self, n: int) -> str:
        if self._words is not None:
            return " ".join(take_words(self._words, n))
        return " ".join(NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(n))

    def _make(self, length: int, depth: float, n: int) -> Sample:
        context, at = insert_at_depth(self._units(n), NEEDLE, depth)
        d = _depth_label(depth)
        return Sample(
            id=_sample_id(length, depth),
            prefix=INTRO + context,
            suffix=QUESTION_SUFFIX,
            answer_prefix=ANSWER_PREFIX,
            references=(ANSWER,),
            max_new_tokens=self.max_new_tokens,
            meta={"length": length, "depth": d, "haystack": self.haystack_used,
                  "needle_char": len(INTRO) + at, "context_chars": len(context)},
        )

    def sample_ids(self) -> list[str]:
        """One id per (length, depth), as :meth:`samples` orders them."""
        return [_sample_id(length, depth) for length in self.lengths for depth in self.depths]

    def data_files(self) -> list[tuple[str, Any]]:
        return [(ESSAY_FILE, essay_path(self.data_dir))] if self._words is not None else []

    def data_source(self) -> str:
        return f"essay haystack ({ESSAY_FILE})" if self._words is not None else "noise haystack (no essay file)"

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per (length, depth), sized with ``builder`` (a PromptBuilder)."""
        builder = self.require_builder(builder)
        out = []
        for length in self.lengths:
            for depth in self.depths:
                s, _ = fit_units(lambda n: self._make(length, depth, n), builder.count, length)
                out.append(s)
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """Contains (0/1) and ROUGE-L recall, best over references."""
        contains = max(float(contains_answer(prediction, r)) for r in references)
        recall = max(rouge_l_recall(prediction, r) for r in references)
        return ScoreResult(score=contains, sub={"rouge_l_recall": recall})

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Overall contains / ROUGE-L recall (%) and a ``grid`` of cells for a heatmap."""
        cells: dict[tuple[int, float], list[Mapping[str, Any]]] = {}
        for r in rows:
            key = (int(row_field(r, "length") or 0), float(row_field(r, "depth") or 0))
            cells.setdefault(key, []).append(r)
        grid = [
            {"length": k[0], "depth": k[1],
             "contains": percent(float(x["score"]) for x in v),
             "rouge_l_recall": percent(float(x.get("rouge_l_recall", 0.0)) for x in v)}
            for k, v in sorted(cells.items())
        ]
        return {
            "contains": percent(float(r["score"]) for r in rows),
            "rouge_l_recall": percent(float(r.get("rouge_l_recall", 0.0)) for r in rows),
            "n": len(rows),
            "grid": grid,
        }
