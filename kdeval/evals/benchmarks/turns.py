"""Generated tasks with several questions per context, one asked per turn (no download, any length and tokenizer).

- ``turns.kv``: multi-key retrieval, SCBench's Retr.KV built the InfiniteBench way: a JSON object of random
  key-value pairs (UUIDs, or 7-digit numbers with ``kind="numbers"``), and one key asked per turn. The asked
  keys sit at evenly spread depths of the object (0 %, ..., 100 %) and are asked in a seeded random order, so a
  policy that kept only what turn 1 needed is caught at the next turns. Score: InfiniteBench's ``kv_match``
  (the value as a whole word of the answer).
- ``turns.needles``: several RULER needles (``One of the special magic numbers for <key> is: <value>.``) in a
  noise or essay haystack at evenly spread depths, one key asked per turn. Score: RULER's ``string_match_all``.

Lengths follow :mod:`kdeval.evals.tasks.synthetic` for the *first* prompt (context, turn 1's question and the
generation fit ``length``); each later turn adds its question and the answer fed back. Keys and values come
from a ``random.Random`` seeded by (seed, task, length, repeat): the same samples on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kdeval.evals.benchmarks.infinitebench.generated import TASKS as IB_TASKS
from kdeval.evals.benchmarks.infinitebench.generated import kv_records
from kdeval.evals.benchmarks.ruler.templates import NEEDLE
from kdeval.evals.benchmarks.ruler.words import ADJECTIVES, NOUNS
from kdeval.evals.metrics.infinitebench import kv_match
from kdeval.evals.metrics.string_match import string_match_all
from kdeval.evals.tasks.base import (EvalError, Followup, Sample, ScoreResult, check_choice, check_positive,
                               group_percent, percent)
from kdeval.evals.tasks.prompting import split_at_context
from kdeval.evals.tasks.synthetic import (ESSAY_FILE, NOISE_SENTENCES, SyntheticTask, check_lengths, essay_path,
                                    essay_words, fit_units, take_words)

KV_TEMPLATE, KV_QUESTION, _, KV_MAX_NEW = IB_TASKS["kv_retrieval"]
#: RULER's single-needle wording (one key, one value per question)
NEEDLES_TEMPLATE = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
                    "I will quiz you about the numbers afterwards.\n{context}\n{query}")
NEEDLES_QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
NEEDLES_ANSWER_PREFIX = " The special magic number mentioned in the provided text is"
NEEDLES_MAX_NEW = 32


def spread(turns: int, n: int) -> list[int]:
    """``turns`` distinct indices of ``n`` units at evenly spread depths (first and last included)."""
    if turns > n:
        raise EvalError(f"turns: {turns} questions need at least {turns} pairs or needles; the length fits {n}")
    if turns == 1:
        return [n // 2]
    return sorted({round(k * (n - 1) / (turns - 1)) for k in range(turns)})


@dataclass
class _TurnsTask(SyntheticTask):
    """What the generated multi-question tasks share: lengths, turns, repeats and seed."""

    lengths: Sequence[int] = (2048,)
    turns: int = 4
    repeats: int = 8
    seed: int = 42

    multi_question = True

    def _check(self) -> None:
        self.lengths = check_lengths(self.lengths)
        check_positive("turns", self.turns)
        check_positive("repeats", self.repeats)

    def _id(self, length: int, r: int) -> str:
        return f"{self.name}/L{length}/r{r}"

    def sample_ids(self) -> list[str]:
        return [self._id(length, r) for length in self.lengths for r in range(self.repeats)]

    def _rng(self, length: int, r: int) -> random.Random:
        return random.Random(f"{self.seed}/{self.name}/{length}/{r}")

    def _make(self, length: int, r: int, n: int) -> Sample:
        raise NotImplementedError

    def _min_units(self) -> int:
        return self.turns

    def samples(self, builder: Any = None) -> list[Sample]:
        """Per length and repeat, the sample with the most units whose first prompt fits the length."""
        builder = self.require_builder(builder)
        return [fit_units(lambda n, a=(length, r): self._make(*a, n), builder.count, length,
                          min_units=self._min_units())[0]
                for length in self.lengths for r in range(self.repeats)]

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Accuracy (%), overall and per turn."""
        return {"accuracy": percent(float(r["score"]) for r in rows), "n": len(rows),
                "by_turn": group_percent(rows, ["turn"])}


@dataclass
class KVTurnsTask(_TurnsTask):
    """Multi-key retrieval, one key per turn (SCBench's Retr.KV, generated). ``kind``: ``uuids`` or ``numbers``."""

    kind: str = "uuids"

    def __post_init__(self) -> None:
        self.name = "turns.kv"
        self._check()
        check_choice("kind", self.kind, ("uuids", "numbers"))

    def generation_length(self) -> int:
        return KV_MAX_NEW

    def _pairs(self, rng: random.Random, n: int) -> list[tuple[str, str]]:
        if self.kind == "uuids":
            return kv_records(rng, n)
        return [(str(rng.randint(10**6, 10**7 - 1)), str(rng.randint(10**6, 10**7 - 1))) for _ in range(n)]

    def _make(self, length: int, r: int, n: int) -> Sample:
        rng = self._rng(length, r)
        pairs = self._pairs(rng, n)
        asked = spread(self.turns, n)
        rng.shuffle(asked)
        context = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
        questions = [KV_QUESTION.format(key=pairs[i][0]) for i in asked]
        prefix, suffix = split_at_context(KV_TEMPLATE, context, input=questions[0])
        follow = tuple(Followup(q, (pairs[i][1],), {"depth": round(100 * i / max(n - 1, 1), 1)})
                       for q, i in zip(questions[1:], asked[1:]))
        return Sample(id=self._id(length, r), prefix=prefix, suffix=suffix, references=(pairs[asked[0]][1],),
                      max_new_tokens=KV_MAX_NEW, followups=follow,
                      meta={"length": length, "depth": round(100 * asked[0] / max(n - 1, 1), 1)})

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """InfiniteBench's kv_retrieval match: the value as a whole word."""
        return ScoreResult(score=1.0 if any(kv_match(prediction, ref) for ref in references) else 0.0)


@dataclass
class NeedlesTurnsTask(_TurnsTask):
    """Several needles, one asked per turn; ``haystack``: ``noise`` or ``essay`` (RULER's Paul Graham essays)."""

    haystack: str = "noise"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        self.name = "turns.needles"
        self._check()
        check_choice("haystack", self.haystack, ("noise", "essay"))
        self._words = essay_words(self.data_dir, required=True) if self.haystack == "essay" else None

    def generation_length(self) -> int:
        return NEEDLES_MAX_NEW

    def data_files(self) -> list[tuple[str, Any]]:
        return [(ESSAY_FILE, essay_path(self.data_dir))] if self._words is not None else []

    def data_source(self) -> str:
        return f"essay haystack ({ESSAY_FILE})" if self._words is not None else "noise haystack"

    def _units(self, n: int) -> list[str]:
        if self._words is not None:
            words = take_words(self._words, 12 * n)
            return [" ".join(words[12 * i : 12 * i + 12]) for i in range(n)]
        return [NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(n)]

    def _make(self, length: int, r: int, n: int) -> Sample:
        rng = self._rng(length, r)
        keys = rng.sample([f"{a}-{b}" for a in ADJECTIVES[:40] for b in NOUNS[:40]], self.turns)
        values = [str(rng.randint(10**6, 10**7 - 1)) for _ in keys]
        units = self._units(n)
        at = spread(self.turns, n + 1)  # a needle may also go after the last unit
        for index, k, v in sorted(zip(at, keys, values), reverse=True):
            units.insert(index, NEEDLE.format(type_needle_v="numbers", key=k, value=v))
        order = list(range(self.turns))
        rng.shuffle(order)
        questions = [NEEDLES_QUESTION.format(key=keys[i]) for i in order]
        prefix, suffix = split_at_context(NEEDLES_TEMPLATE, "\n".join(units), query=questions[0])
        depth = {i: round(100 * at[i] / max(n, 1), 1) for i in range(self.turns)}
        follow = tuple(Followup(q, (values[i],), {"depth": depth[i]}) for q, i in zip(questions[1:], order[1:]))
        return Sample(id=self._id(length, r), prefix=prefix, suffix=suffix, references=(values[order[0]],),
                      max_new_tokens=NEEDLES_MAX_NEW, answer_prefix=NEEDLES_ANSWER_PREFIX, followups=follow,
                      meta={"length": length, "depth": depth[order[0]]})

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """RULER's string_match_all: the share of references in the answer."""
        return ScoreResult(score=string_match_all(prediction, list(references)))
