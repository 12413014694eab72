"""InfiniteBench's per-sample scores (OpenBMB/InfiniteBench ``src/compute_scores.py``), re-implemented.

- passkey, number_string: the first run of digits in the prediction equals the label.
- kv_retrieval: the label is one of the prediction's words once ``\\n : " ' . , ? ! { }`` become spaces.
- longbook_qa_eng (En.QA): token F1 after SQuAD normalization, max over the labels.
- longbook_choice_eng (En.MC): the labels are the gold option's text and its letter; the prediction's first
  character, else the whole prediction, else the text after an answer phrase, else its first word that is a
  piece of ``"ABCD"``, is matched against them (the official order of rules).
"""
from __future__ import annotations

import re
from typing import Sequence

from kdeval.evals.metrics.longbench import qa_f1_score

_NOT_DIGIT = re.compile(r"[^0-9]")
_ANSWER_PHRASES = ("answer is:", "answer:", "answer is", "option is")


def first_int(prediction: str) -> str:
    """The first run of digits in ``prediction`` (``""`` when none)."""
    return next((part for part in _NOT_DIGIT.split(prediction) if part), "")


def digits_match(prediction: str, label: str) -> bool:
    """passkey / number_string."""
    return first_int(prediction) == label


def _spaced(text: str, chars: str) -> str:
    for c in chars:
        text = text.replace(c, " ")
    return text


def kv_match(prediction: str, label: str) -> bool:
    """kv_retrieval: the label is a whole word of the prediction."""
    return label in _spaced(prediction, "\n:\"'.,?!{}").split()


def qa_f1(prediction: str, labels: Sequence[str]) -> float:
    """En.QA: the best token F1 over the labels (0 without labels)."""
    return max((qa_f1_score(prediction, label) for label in labels), default=0.0)


def choice_match(prediction: str, labels: Sequence[str]) -> bool:
    """En.MC: ``labels`` = [gold option text, gold letter]."""
    pred = prediction.strip()
    if not pred:
        return False
    if pred[0] in "ABCD":
        return pred[0] in labels
    if pred in labels:
        return True
    pred = _spaced(pred, "\n\"'.,?!{}")
    pred = re.sub(" {2,}", " ", pred)
    for phrase in _ANSWER_PHRASES:
        at = pred.find(phrase)
        if at == -1:
            continue
        if len(pred) < at + len(phrase) + 1:  # the prediction ends with the phrase
            return False
        rest = pred[at + len(phrase) + 1:]
        return any(rest.startswith(label) for label in labels)
    for word in pred.split():
        if word in "ABCD":  # a substring test, as the official code: "AB" passes and then fails below
            return word in labels
    return False
