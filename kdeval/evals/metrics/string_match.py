"""RULER's metrics (scripts/eval/synthetic/constants.py), per sample, with its prediction cleanup."""
from __future__ import annotations

import re
from typing import Sequence

_NON_PRINTABLE = re.compile(r"[\x00-\x1f]")


def postprocess_pred(prediction: str) -> str:
    """RULER's cleanup: strip, turn control characters into newlines, strip again."""
    return _NON_PRINTABLE.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of the references found (case-insensitive substring) in the prediction."""
    pred = prediction.lower()
    return sum(1.0 for r in references if r.lower() in pred) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1 if any reference is found (case-insensitive substring) in the prediction, else 0."""
    pred = prediction.lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in references)
