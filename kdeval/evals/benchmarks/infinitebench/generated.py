"""InfiniteBench's synthetic retrieval tasks, generated offline from its recipe (``data/construct_synthetic_dataset.py``).

- passkey: noise lines with ``The pass key is K. Remember it. K is the pass key.`` at a depth; K = 5 random digits.
- number_string: the same with ``The sequence of digits is K ...``; K = 5 random digits, each of 5 more
  inserted as a copy of a digit before it (10 digits).
- kv_retrieval: a JSON object of random UUID keys and values; one key asked, at a depth of the object.

Each sample is sized to a target length (tokens, prompt + generation, :mod:`kdeval.evals.tasks.synthetic`) with as
many noise lines or pairs as fit, for each depth (percent of the context before the answer) and repeat;
keys come from a ``random.Random`` seeded by (seed, task, length, depth, repeat), so samples are the same on
every machine. Prompts and generation lengths: the open-model templates and ``DATA_NAME_TO_MAX_NEW_TOKENS``
of InfiniteBench's ``src/``; scores: :mod:`kdeval.evals.metrics.infinitebench`.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kdeval.evals.metrics.infinitebench import digits_match, kv_match
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, check_choice, check_positive, group_percent, percent
from kdeval.evals.tasks.prompting import split_at_context
from kdeval.evals.tasks.synthetic import SyntheticTask, check_lengths, fit_units

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
#: task -> (yarn_mistral template verbatim, question, answer line, official max_new_tokens)
TASKS: dict[str, tuple[str, str, str, int]] = {
    "passkey": ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
                "quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
                "What is the pass key?", "The pass key is {key}. Remember it. {key} is the pass key.\n", 6),
    "number_string": ("There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you "
                      "about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",
                      "What is the sequence of digits?",
                      "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n", 12),
    "kv_retrieval": ("Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n"
                     "{input}", "\nKey: \"{key}\"\nThe value associated with the specified key is: ", "", 50),
}


def passkey_key(rng: random.Random) -> str:
    """Five random digits."""
    return "".join(str(rng.randint(0, 9)) for _ in range(5))


def number_string_key(rng: random.Random) -> str:
    """Five random digits, then five insertions each copying the digit at a random earlier position."""
    digits = [str(rng.randint(0, 9)) for _ in range(5)]
    for k in range(5):
        pos = rng.randint(0, 5 + k - 1)
        digits.insert(pos, digits[pos])
    return "".join(digits)


def kv_records(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """``n`` (key, value) pairs of random version-4 UUID strings (the first ``n`` of the seeded stream)."""
    return [(str(uuid.UUID(int=rng.getrandbits(128), version=4)), str(uuid.UUID(int=rng.getrandbits(128), version=4)))
            for _ in range(n)]


def at_depth(depth: float, n: int) -> int:
    """The unit index ``depth`` percent into ``n`` units (0..n)."""
    return round(depth / 100 * n)


@dataclass
class InfiniteBenchSyntheticTask(SyntheticTask):
    """passkey, number_string or kv_retrieval, sized per tokenizer.

    Args:
        subset: ``passkey``, ``number_string`` or ``kv_retrieval``.
        lengths: target lengths in tokens (prompt + max_new_tokens).
        depths: where the answer sits, in percent of the context.
        repeats: samples per (length, depth), each with its own key.
        seed: base seed.
    """

    subset: str
    lengths: Sequence[int] = (4096,)
    depths: Sequence[float] = (0, 25, 50, 75, 100)
    repeats: int = 1
    seed: int = 42

    def __post_init__(self) -> None:
        check_choice("subset", self.subset, tuple(TASKS))
        self.name = f"infinitebench.{self.subset}"
        self.lengths = check_lengths(self.lengths)
        self.depths = tuple(float(d) for d in ([self.depths] if isinstance(self.depths, (int, float)) else self.depths))
        if not self.depths or any(not 0 <= d <= 100 for d in self.depths):
            raise EvalError(f"depths: expected a non-empty list of percentages in [0, 100], got {list(self.depths)}")
        check_positive("repeats", self.repeats)

    def generation_length(self) -> int:
        return TASKS[self.subset][3]

    def _id(self, length: int, depth: float, r: int) -> str:
        return f"{self.name}/L{length}/d{depth:g}/r{r}"

    def sample_ids(self) -> list[str]:
        return [self._id(length, d, r) for length in self.lengths for d in self.depths for r in range(self.repeats)]

    def _sample(self, length: int, depth: float, r: int, n: int) -> Sample:
        """The sample with ``n`` noise lines (passkey, number_string) or ``n`` pairs (kv_retrieval)."""
        template, question, answer_line, max_new = TASKS[self.subset]
        rng = random.Random(f"{self.seed}/{self.subset}/{length}/{depth:g}/{r}")
        if self.subset == "kv_retrieval":
            pairs = kv_records(rng, n)
            key, answer = pairs[min(at_depth(depth, n), n - 1)]
            context = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
            question = question.format(key=key)
        else:
            answer = passkey_key(rng) if self.subset == "passkey" else number_string_key(rng)
            j = at_depth(depth, n)
            context = NOISE * j + answer_line.format(key=answer) + NOISE * (n - j)
        prefix, suffix = split_at_context(template, context, input=question)
        return Sample(id=self._id(length, depth, r), prefix=prefix, suffix=suffix, references=(answer,),
                      max_new_tokens=max_new, meta={"length": length, "depth": depth})

    def samples(self, builder: Any = None) -> list[Sample]:
        """Per length, depth and repeat, the sample with the most units that fits the length."""
        builder = self.require_builder(builder)
        out = []
        for length in self.lengths:
            for depth in self.depths:
                for r in range(self.repeats):
                    sample, _ = fit_units(lambda n, a=(length, depth, r): self._sample(*a, n), builder.count, length)
                    out.append(sample)
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """The official match: first digit run (passkey, number_string) or a whole word (kv_retrieval)."""
        match = kv_match if self.subset == "kv_retrieval" else digits_match
        return ScoreResult(score=1.0 if any(match(prediction, ref) for ref in references) else 0.0)

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Accuracy (%), overall and per length."""
        return {"accuracy": percent(float(r["score"]) for r in rows), "n": len(rows),
                "by_length": group_percent(rows, ["length"])}
