"""SCBench's per-turn scores (microsoft/MInference ``scbench/compute_scores.py``), re-implemented.

SCBench scores most of its tasks with InfiniteBench's functions, mapped by task:

- ``scbench_kv``, ``scbench_prefix_suffix``: ``kv_retrieval`` there, which in SCBench's copy is a plain
  substring test (the label appears in the prediction), not InfiniteBench's whole-word match;
- ``scbench_passkey``: the first run of digits equals the label;
- ``scbench_qa_eng``, ``scbench_many_shot``: ``longdialogue_qa_eng``: some label, upper-cased, appears in the
  upper-cased prediction (0/1);
- ``scbench_vt``: ``string_match_all``: the share of labels in the lower-cased prediction, rounded to 2;
- ``scbench_choice_eng``: ``longbook_choice_eng`` (:func:`kdeval.evals.metrics.infinitebench.choice_match`).
"""
from __future__ import annotations

from typing import Sequence


def substring_match(prediction: str, labels: Sequence[str]) -> float:
    """scbench_kv / scbench_prefix_suffix: 1 when some label is a substring of the prediction."""
    return 1.0 if any(label in prediction for label in labels) else 0.0


def any_upper_match(prediction: str, labels: Sequence[str]) -> float:
    """scbench_qa_eng / scbench_many_shot: 1 when some label appears in the prediction, case ignored."""
    pred = prediction.strip().upper()
    return 1.0 if any(label.upper() in pred for label in labels) else 0.0


def share_match(prediction: str, labels: Sequence[str]) -> float:
    """scbench_vt: the share of labels in the prediction, case ignored, rounded to 2 decimals."""
    if not labels:
        return 0.0
    pred = prediction.lower()
    return round(sum(1.0 for label in labels if label.lower() in pred) / len(labels), 2)
