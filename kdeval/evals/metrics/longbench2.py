"""LongBench v2's answer extraction and accuracy (THUDM/LongBench, v2 ``pred.py`` and ``result.py``).

The response (stripped, ``*`` removed) is searched for ``The correct answer is (X)`` and then for
``The correct answer is X`` (X in A-D); the first match is the predicted choice, none is no answer. A sample
scores 1 when the choice equals the gold letter. Headlines: accuracy in percent rounded to one decimal,
overall and per difficulty (easy / hard) and per length (short / medium / long).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

_WITH_PARENS = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")

DIFFICULTIES = ("easy", "hard")
LENGTHS = ("short", "medium", "long")


def extract_choice(response: str) -> str | None:
    """The letter the response names as its answer, or None."""
    text = response.strip().replace("*", "")
    for pattern in (_WITH_PARENS, _BARE):
        found = pattern.search(text)
        if found:
            return found.group(1)
    return None


def accuracy_table(rows: Sequence[Mapping[str, Any]], difficulty: str = "difficulty", length: str = "length_bucket",
                   score: str = "score") -> dict[str, float]:
    """``{"overall", "easy", "hard", "short", "medium", "long"}``: 100 × mean score rounded to 1 decimal, as
    the official result table (a bucket with no sample is NaN). Rows not ``easy`` count as hard and rows neither
    ``short`` nor ``medium`` as long, as there."""
    def pct(values: list[float]) -> float:
        return round(100 * sum(values) / len(values), 1) if values else float("nan")

    scores = [float(r[score]) for r in rows]
    diff = ["easy" if r.get(difficulty) == "easy" else "hard" for r in rows]
    size = [r.get(length) if r.get(length) in ("short", "medium") else "long" for r in rows]
    out = {"overall": pct(scores)}
    out.update({d: pct([s for s, x in zip(scores, diff) if x == d]) for d in DIFFICULTIES})
    out.update({b: pct([s for s, x in zip(scores, size) if x == b]) for b in LENGTHS})
    return out
