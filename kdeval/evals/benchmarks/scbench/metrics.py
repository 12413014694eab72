"""SCBench's per-turn scores (microsoft/MInference ``scbench/compute_scores.py``), re-implemented.

SCBench scores most of its tasks with InfiniteBench's functions, mapped by task:

- ``scbench_kv``, ``scbench_prefix_suffix``: ``kv_retrieval`` there, which in SCBench's copy is a plain
  substring test (the label appears in the prediction), not InfiniteBench's whole-word match;
- ``scbench_passkey``: the first run of digits equals the label;
- ``scbench_qa_eng``, ``scbench_many_shot``: ``longdialogue_qa_eng``: some label, upper-cased, appears in the
  upper-cased prediction (0/1);
- ``scbench_vt``: ``string_match_all``: the share of labels in the lower-cased prediction, rounded to 2;
- ``scbench_choice_eng``: ``longbook_choice_eng`` (:func:`kdeval.evals.metrics.infinitebench.choice_match`);
- ``scbench_qa_chn``: ``longbook_qa_chn``: F1 over characters (one character, one token) after Chinese
  normalization, the best over the labels;
- ``scbench_mf``: ``math_find``: the first number in the prediction equals the label, as an int when the label
  is an int (the number's float value truncated), as a float when it is a float;
- ``scbench_summary``: ``evaluate``'s ``rouge`` metric, whose ``rougeLsum`` F-measure is Google's
  ``rouge-score`` (summary-level LCS over the lines, its default tokenizer, no stemming);
- ``scbench_repoqa``: :mod:`kdeval.evals.benchmarks.scbench.repoqa`;
- the mixed tasks score each turn by its own sub-task's function (``summary_with_needles``: summary and
  passkey; ``repoqa_and_kv``: repoqa and kv).
"""
from __future__ import annotations

import re
from typing import Sequence

from kdeval.evals.metrics.longbench import normalize_zh_answer, token_f1

_NUMBER = re.compile(r"\d+\.\d+|\d+")


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


def qa_f1_chars(prediction: str, labels: Sequence[str]) -> float:
    """scbench_qa_chn: the best character F1 over the labels (0 without labels)."""
    pred = list(normalize_zh_answer(prediction))
    return max((token_f1(pred, list(normalize_zh_answer(label))) for label in labels), default=0.0)


def math_find(prediction: str, label: str) -> float:
    """scbench_mf: 1 when the prediction's first number equals ``label`` (an int's or a float's text, e.g.
    ``"42"`` or ``"3.5"``): for an int label the number's float value is truncated, for a float one compared
    exactly."""
    found = _NUMBER.search(prediction)
    if found is None:
        return 0.0
    number = float(found.group(0))
    if re.fullmatch(r"-?\d+", label.strip()):
        return 1.0 if int(number) == int(label) else 0.0
    return 1.0 if number == float(label) else 0.0


def rouge_lsum(prediction: str, reference: str) -> float:
    """scbench_summary: ROUGE-Lsum F-measure of ``rouge-score`` (lines are the sentences)."""
    from rouge_score import rouge_scorer  # imported when a summary is scored: it pulls in nltk and absl

    return float(rouge_scorer.RougeScorer(["rougeLsum"]).score(reference, prediction)["rougeLsum"].fmeasure)
