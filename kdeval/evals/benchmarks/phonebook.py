"""Phonebook lookup (KeyDiff paper, appendix): a list of names and phone numbers, one name asked.

Each book is sized to a target length (see :mod:`kdeval.evals.tasks.synthetic`) and asked
``questions_per_book`` questions about entries spread evenly through it; the questions share the
book as their context (compressed once). Score: exact match of the first phone number in the
prediction with the asked one.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kdeval.evals.tasks.base import Sample, ScoreResult, check_positive, group_percent, percent
from kdeval.evals.tasks.synthetic import SyntheticTask, check_lengths, fit_units

FIRST = ("James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara Richard Susan Joseph "
         "Jessica Thomas Sarah Charles Karen Daniel Lisa Matthew Nancy Anthony Betty Mark Sandra Donald Ashley Steven "
         "Emily Paul Donna Andrew Michelle Joshua Carol Kenneth Amanda Kevin Melissa Brian Deborah George Stephanie "
         "Edward Rebecca Ronald Laura Timothy Sharon Jason Cynthia Jeffrey Kathleen Ryan Amy Jacob Angela").split()
LAST = ("Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Gonzalez Wilson "
        "Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris Sanchez Clark Ramirez Lewis "
        "Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill Flores Green Adams Nelson Baker Hall Rivera "
        "Campbell Mitchell Carter Roberts Gomez Phillips Evans Turner Diaz Parker Cruz Edwards Collins Reyes").split()
INTRO = "Below is a phonebook. Memorize the phone number of each person.\n\n"
QUESTION = "\n\nQuestion: What is the phone number of {name}?"
ANSWER_PREFIX = " Answer: The phone number of {name} is"
_PHONE = re.compile(r"\d{3}-\d{3}-\d{4}")


def first_phone(text: str) -> str | None:
    """The first ``ddd-ddd-dddd`` in ``text``."""
    m = _PHONE.search(text)
    return m.group(0) if m else None


@dataclass
class PhonebookTask(SyntheticTask):
    """Phonebook lookup.

    Args:
        lengths: target lengths in tokens (prompt + max_new_tokens).
        num_books: books per length.
        questions_per_book: names asked per book (sharing the book as context).
        seed: base seed.
        max_new_tokens: generation length.
    """

    lengths: Sequence[int] = (2048,)
    num_books: int = 2
    questions_per_book: int = 4
    seed: int = 42
    max_new_tokens: int = 16

    def __post_init__(self) -> None:
        self.name = "phonebook"
        self.lengths = check_lengths(self.lengths)
        for f in ("num_books", "questions_per_book", "max_new_tokens"):
            check_positive(f, getattr(self, f))

    def _book(self, length: int, b: int, n: int) -> list[tuple[str, str]]:
        rng = random.Random(f"{self.seed}/phonebook/{length}/{b}")
        names = [f"{f} {l}" for f in FIRST for l in LAST]
        rng.shuffle(names)
        if n > len(names):
            names = [f"{nm} {i // len(names) + 1}" if i >= len(names) else nm for i, nm in enumerate(names * (n // len(names) + 1))]
        return [(names[i], f"{rng.randint(200, 999)}-{rng.randint(200, 999)}-{rng.randint(0, 9999):04d}") for i in range(n)]

    def _questions(self, length: int, b: int, n: int) -> list[Sample]:
        entries = self._book(length, b, n)
        prefix = INTRO + "\n".join(f"{name}: {phone}" for name, phone in entries)
        q = min(self.questions_per_book, n)
        out = []
        for j in range(q):
            idx = min(n - 1, int((j + 0.5) * n / q))
            name, phone = entries[idx]
            out.append(Sample(
                id=f"phonebook/L{length}/b{b}/q{j}", prefix=prefix, suffix=QUESTION.format(name=name),
                answer_prefix=ANSWER_PREFIX.format(name=name), references=(phone,), max_new_tokens=self.max_new_tokens,
                meta={"length": length, "book": b, "entries": n, "depth": round(100 * idx / max(1, n - 1), 1)},
            ))
        return out

    def sample_ids(self) -> list[str]:
        """``num_books × questions_per_book`` ids per length, as :meth:`samples` orders them (a book always has
        at least ``questions_per_book`` entries)."""
        return [f"phonebook/L{length}/b{b}/q{j}" for length in self.lengths for b in range(self.num_books)
                for j in range(self.questions_per_book)]

    def samples(self, builder: Any = None) -> list[Sample]:
        """``num_books`` books per length, each with its questions (consecutive, same prefix)."""
        builder = self.require_builder(builder)
        out: list[Sample] = []
        for length in self.lengths:
            for b in range(self.num_books):
                def longest(n: int, length: int = length, b: int = b) -> Sample:
                    # the questions share the book (prefix): compare them without re-tokenizing it
                    return max(self._questions(length, b, n), key=builder.count_besides_prefix)
                _, n = fit_units(longest, builder.count, length, min_units=self.questions_per_book)
                out.extend(self._questions(length, b, n))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """1 when the first phone number in the prediction is the asked one."""
        found = first_phone(prediction)
        return ScoreResult(score=1.0 if found is not None and found in references else 0.0)

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Accuracy (%), overall and per length."""
        return {
            "accuracy": percent(float(r["score"]) for r in rows),
            "n": len(rows),
            "by_length": group_percent(rows, ["length"]),
        }
