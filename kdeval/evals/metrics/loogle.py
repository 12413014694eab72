"""LooGLE's automatic metrics for QA (bigai-nlco/LooGLE ``Evaluation/automatic_metrics.py``), with the
libraries it uses: nltk (BLEU, METEOR) and ``rouge``.

Per answer: BLEU-1 and BLEU-4 (nltk ``sentence_bleu`` on whitespace words, newlines as spaces), ROUGE-1/2/L
recall (``rouge``), METEOR (nltk ``single_meteor_score`` on the word sets, as there). An empty prediction is
scored as ``"None"``, as the official evaluation loop does.

Not computed here: BERTScore (it needs roberta-large's weights) and, when nltk's WordNet data is not installed
(``nltk.download("wordnet")``), METEOR: the row then has no ``meteor`` column.
"""
from __future__ import annotations

import warnings
from functools import lru_cache

from rouge import Rouge

NOT_COMPUTED = {"bertscore": "needs the roberta-large model weights (bert-score), not available offline"}


@lru_cache(maxsize=1)
def wordnet_available() -> bool:
    """Whether nltk's WordNet corpus (METEOR's synonym stage) is installed."""
    import nltk

    try:
        nltk.data.find("corpora/wordnet")
    except LookupError:
        try:
            nltk.data.find("corpora/wordnet.zip")
        except LookupError:
            return False
    return True


def _words(text: str) -> list[str]:
    return text.replace("\n", " ").split()


def bleu(reference: str, hypothesis: str) -> dict[str, float]:
    """``{"bleu1", "bleu4"}``: nltk sentence BLEU with unigram-only and 4-gram-only weights."""
    from nltk.translate.bleu_score import sentence_bleu

    ref, hyp = _words(reference), _words(hypothesis)
    with warnings.catch_warnings():  # nltk warns when a hypothesis has no n-gram of some order (the score is 0)
        warnings.simplefilter("ignore")
        return {"bleu1": float(sentence_bleu([ref], hyp, weights=(1, 0, 0, 0))),
                "bleu4": float(sentence_bleu([ref], hyp, weights=(0, 0, 0, 1)))}


def rouge_recall(reference: str, hypothesis: str) -> dict[str, float]:
    """``{"rouge1", "rouge2", "rougeL"}``: the ``rouge`` package's recalls; 0 when it cannot score the pair
    (e.g. a hypothesis of punctuation only)."""
    try:
        scores = Rouge().get_scores(hyps=[hypothesis], refs=[reference])[0]
    except (ValueError, RecursionError):
        return {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    return {"rouge1": scores["rouge-1"]["r"], "rouge2": scores["rouge-2"]["r"], "rougeL": scores["rouge-l"]["r"]}


def meteor(reference: str, hypothesis: str) -> float | None:
    """nltk METEOR on the word sets (official form), or None without WordNet data."""
    if not wordnet_available():
        return None
    from nltk.translate.meteor_score import single_meteor_score

    return float(single_meteor_score(set(_words(reference)), set(_words(hypothesis))))


def loogle_scores(reference: str, prediction: str) -> dict[str, float]:
    """Every metric computed here for one answer (``meteor`` only with WordNet data)."""
    hypothesis = prediction if prediction != "" else "None"
    out = {**bleu(reference, hypothesis), **rouge_recall(reference, hypothesis)}
    m = meteor(reference, hypothesis)
    if m is not None:
        out["meteor"] = m
    return out
