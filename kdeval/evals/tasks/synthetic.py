"""Shared pieces of the synthetic tasks: haystacks and fitting a prompt to a target length.

Length convention (RULER's): a sample generated for length ``L`` has
``prompt tokens (chat template included) + max_new_tokens <= L``, and one more haystack unit
would exceed ``L``. So the tolerance below ``L`` is the size of one haystack unit.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from kdeval.evals.tasks.base import ContextTooLongError, DataNotFoundError, EvalError, Sample, Task
from kdeval.evals.tasks.data import find_data_file, require_data_file

#: RULER's noise haystack (one unit)
NOISE_PARAGRAPH = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = tuple(s + "." for s in NOISE_PARAGRAPH.rstrip(".").split(". "))
ESSAY_FILE = "haystack/PaulGrahamEssays.json"
_ESSAY_HOW = "It is RULER's Paul Graham essay haystack (scripts/data/synthetic/json/PaulGrahamEssays.json): {\"text\": ...}."


@lru_cache(maxsize=None)
def _read_essay_words(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = json.load(f).get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataNotFoundError(f"{path}: expected a JSON object with a non-empty 'text' string")
    return re.sub(r"\s+", " ", text).strip().split(" ")


def essay_path(data_dir: str | None) -> Path | None:
    """The essay haystack file in the data directory, or None when absent."""
    return find_data_file(data_dir, ESSAY_FILE)


def essay_words(data_dir: str | None, required: bool) -> list[str] | None:
    """The essay haystack split on whitespace (as RULER), read once per file; None when absent and not ``required``."""
    path = essay_path(data_dir)
    if path is None:
        if required:
            require_data_file(data_dir, ESSAY_FILE, _ESSAY_HOW)
        return None
    return _read_essay_words(path)


def take_words(words: Sequence[str], n: int) -> list[str]:
    """The first ``n`` words, cycling through ``words`` when ``n`` exceeds its length."""
    if n <= len(words):
        return list(words[:n])
    reps = -(-n // len(words))
    return (list(words) * reps)[:n]


_SENT_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Split on whitespace after ``.``, ``!`` or ``?`` (a light stand-in for nltk's sent_tokenize)."""
    return [s for s in _SENT_END.split(text.strip()) if s]


def check_lengths(lengths: Sequence[int], field: str = "lengths") -> tuple[int, ...]:
    """Validate a list of target lengths (positive integers)."""
    if isinstance(lengths, int):
        lengths = (lengths,)
    out = tuple(int(x) for x in lengths)
    if not out or any(x < 64 for x in out):
        raise EvalError(f"{field}: expected a non-empty list of integers >= 64, got {list(lengths)}")
    return out


def check_fits(lengths: Sequence[int], max_context: int, task: str) -> None:
    """Raise when a requested length exceeds the model's context."""
    too_long = [x for x in lengths if x > max_context]
    if too_long:
        raise ContextTooLongError(
            f"{task}: lengths {too_long} exceed the model's context ({max_context} tokens); "
            f"expected every length <= {max_context}")


class SyntheticTask(Task):
    """A task whose samples are generated per tokenizer to fit target ``lengths`` (needle, RULER, phonebook)."""

    lengths: tuple[int, ...]

    def check_context(self, max_context: int) -> None:
        check_fits(self.lengths, max_context, self.name)

    def require_builder(self, builder: Any) -> Any:
        """``builder``, or an error saying that these samples need one."""
        if builder is None:
            raise EvalError(f"{self.name}: samples are sized per tokenizer; pass builder=PromptBuilder(tokenizer, max_context)")
        return builder


def fit_units(make: Callable[[int], Sample], count: Callable[[Sample], int], target: int,
              tokens_per_unit_hint: float | None = None, min_units: int = 1) -> tuple[Sample, int]:
    """The sample with the most haystack units whose ``count + max_new_tokens <= target``.

    ``make(n)`` must build the sample with ``n`` units and grow with ``n``. Binary search from an
    estimate of tokens per unit (measured on ``min_units`` and ``min_units + 16`` when not given).
    """
    def total(n: int) -> int:
        s = make(n)
        return count(s) + s.max_new_tokens

    base = total(min_units)
    if base > target:
        raise ContextTooLongError(
            f"target length {target} is too small: the template alone with {min_units} unit(s) needs "
            f"{base} tokens (prompt + max_new_tokens)")
    if tokens_per_unit_hint is None:
        tokens_per_unit_hint = max((total(min_units + 16) - base) / 16, 0.1)
    lo = min_units
    hi = max(min_units + 1, min_units + int((target - base) / max(tokens_per_unit_hint, 0.1)) + 1)
    while total(hi) <= target:  # grow the upper bound until it overshoots
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: total(lo) <= target < total(hi)
        mid = (lo + hi) // 2
        if total(mid) <= target:
            lo = mid
        else:
            hi = mid
    return make(lo), lo
