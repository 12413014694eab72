"""LongBench v1's official metrics, reimplemented to give the official scorer's numbers.

Per prediction the official scorer takes the max over references; a task's headline is
``round(100 * mean, 2)``; for trec, triviaqa, samsum and lsht only the first line of the
prediction is scored (see :func:`first_line`). Libraries as in the official scorer: ``rouge``
(not ``rouge-score``), ``fuzzywuzzy`` (difflib's SequenceMatcher, no python-Levenshtein), ``jieba``.
"""
from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

with warnings.catch_warnings():  # fuzzywuzzy warns that it falls back to difflib: that is wanted
    warnings.simplefilter("ignore")
    from fuzzywuzzy import fuzz

_EN_PUNCT = frozenset(string.punctuation)
_ZH_PUNCT = frozenset(
    string.punctuation
    + "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DIGITS = re.compile(r"\d+")

#: tasks whose prediction is cut to its first line before scoring (official eval.py)
FIRST_LINE_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def first_line(prediction: str) -> str:
    """The first line after leading newlines (official rule for trec/triviaqa/samsum/lsht)."""
    return prediction.lstrip("\n").split("\n")[0]


def normalize_answer(s: str) -> str:
    """English normalization: lower case, drop punctuation, drop articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _EN_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def normalize_zh_answer(s: str) -> str:
    """Chinese normalization: lower case, drop (CJK and ASCII) punctuation, remove all whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _ZH_PUNCT)
    return "".join(s.split())


def token_f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """Bag-of-tokens F1 (multiset overlap)."""
    overlap = sum((Counter(prediction) & Counter(ground_truth)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction)
    recall = overlap / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """Token F1 after English normalization."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _jieba_tokens(text: str) -> list[str]:
    import jieba  # imported lazily: it prints a banner and builds a dictionary on first use

    return list(jieba.cut(text, cut_all=False))


def qa_f1_zh_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """Token F1 over jieba words, each normalized, empty ones dropped."""
    pred = [t for t in (normalize_zh_answer(w) for w in _jieba_tokens(prediction)) if t]
    gold = [t for t in (normalize_zh_answer(w) for w in _jieba_tokens(ground_truth)) if t]
    return token_f1(pred, gold)


def rouge_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """ROUGE-L F of the ``rouge`` package; 0 when it raises (e.g. an empty prediction)."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - the official scorer maps every failure to 0
        return 0.0
    return float(scores["rouge-l"]["f"])


def rouge_zh_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """ROUGE-L F over jieba words joined by spaces."""
    return rouge_score(" ".join(_jieba_tokens(prediction)), " ".join(_jieba_tokens(ground_truth)))


def _id_vote(prediction: str, target: str) -> float:
    """Fraction of the integers in ``prediction`` that equal ``target`` (0 when there are none)."""
    numbers = _DIGITS.findall(prediction)
    if not numbers:
        return 0.0
    return sum(1 for n in numbers if n == target) / len(numbers)


def count_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """passage_count: share of the numbers in the prediction equal to the answer."""
    return _id_vote(prediction, str(ground_truth))


def retrieval_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """passage_retrieval_en: the answer is ``Paragraph N``; share of numbers equal to N."""
    return _id_vote(prediction, re.findall(r"Paragraph (\d+)", ground_truth)[0])


def retrieval_zh_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """passage_retrieval_zh: the answer is ``段落N``; share of numbers equal to N."""
    return _id_vote(prediction, re.findall(r"段落(\d+)", ground_truth)[0])


def code_sim_score(prediction: str, ground_truth: str, **_: Any) -> float:
    """lcc/repobench-p: fuzz.ratio/100 of the first line without a backtick, ``#`` or ``//``."""
    chosen = ""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            chosen = line
            break
    return fuzz.ratio(chosen, ground_truth) / 100


def classification_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """trec/lsht: 1/k when the answer is among the k class names found in the prediction.

    Class names found in the prediction that are substrings of the answer (but not the answer)
    are dropped first. The official code removes from the list it iterates over, which skips the
    element after each removal; that behaviour is kept so the numbers match.
    """
    all_classes: Sequence[str] = kwargs["all_classes"]
    matches = [c for c in all_classes if c in prediction]
    i = 0
    while i < len(matches):  # a for-loop over a list keeps advancing its index after a removal
        term = matches[i]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
        i += 1
    if ground_truth in matches:
        return 1.0 / len(matches)
    return 0.0


MetricFn = Callable[..., float]

#: official LongBench dataset -> metric
DATASET2METRIC: dict[str, MetricFn] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_retrieval_en": retrieval_score,
    "passage_count": count_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}


def score_sample(dataset: str, prediction: str, references: Sequence[str], all_classes: Sequence[str] | None) -> float:
    """One sample's official score: first-line rule, then the max of the metric over references."""
    if dataset in FIRST_LINE_TASKS:
        prediction = first_line(prediction)
    metric = DATASET2METRIC[dataset]
    best = 0.0
    for ref in references:
        best = max(best, float(metric(prediction, ref, all_classes=all_classes)))
    return best


def scorer(dataset: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], all_classes: Sequence[str] | None) -> float:
    """The official headline: ``round(100 * mean over samples of the per-sample max, 2)``."""
    total = sum(score_sample(dataset, p, a, all_classes) for p, a in zip(predictions, answers))
    return round(100 * total / len(predictions), 2)
