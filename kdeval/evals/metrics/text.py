"""Small text metrics: substring containment and ROUGE-L recall on normalized words."""
from __future__ import annotations

from typing import Sequence

from kdeval.evals.metrics.longbench import normalize_answer


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists (O(len(a)*len(b)))."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l_recall(prediction: str, reference: str) -> float:
    """LCS(prediction, reference) / len(reference) over normalized words (lower case, no punctuation/articles)."""
    ref = normalize_answer(reference).split()
    if not ref:
        return 0.0
    return lcs_length(normalize_answer(prediction).split(), ref) / len(ref)


def contains_answer(prediction: str, reference: str) -> bool:
    """Whether the normalized reference appears in the normalized prediction (word-aligned)."""
    ref = normalize_answer(reference)
    return bool(ref) and f" {ref} " in f" {normalize_answer(prediction)} "
