"""LooGLE: metrics against a re-statement of the official automatic_metrics.py on hand-made predictions, the
official prompt, the fixture loader (Python-literal qa_pairs), and what is not computed offline."""
from __future__ import annotations

import pytest
from nltk.translate.bleu_score import sentence_bleu
from rouge import Rouge

from kdeval.evals.benchmarks.loogle.task import LooGLETask
from kdeval.evals.benchmarks.registry import get_scorer, get_spec
from kdeval.evals.metrics import loogle as m
from kdeval.evals.tasks.base import DataNotFoundError


# --- reference: bigai-nlco/LooGLE Evaluation/automatic_metrics.py (+ automatic_eval.py's '' -> 'None'), restated -
def ref_bleu(reference, hypothesis):
    reference, hypothesis = reference.replace("\n", " ").split(), hypothesis.replace("\n", " ").split()
    return (sentence_bleu([reference], hypothesis, weights=(1, 0, 0, 0)),
            sentence_bleu([reference], hypothesis, weights=(0, 0, 0, 1)))


def ref_rouge(reference, hypothesis, metric="r"):
    rouge_ = Rouge().get_scores(hyps=[hypothesis], refs=[reference])[0]
    return rouge_["rouge-1"][metric], rouge_["rouge-2"][metric], rouge_["rouge-l"][metric]


def ref_scores(ref, hyp):
    hyp = 'None' if hyp == '' else hyp
    return (*ref_bleu(ref, hyp), *ref_rouge(ref, hyp))
# --- end of reference -------------------------------------------------------------------------------------------

REFERENCE = "The astronomer Ada Voss founded it in 1921."
PREDICTIONS = [
    "Ada Voss founded the observatory in 1921.", "The astronomer Ada Voss founded it in 1921.", "Ada Voss",
    "It was founded\nby the astronomer Ada Voss in 1921", "", "None", "In 1921.", "nobody knows",
    "the the the astronomer astronomer", "Ada Voss, an astronomer, in 1921; the observatory opened later.",
]


@pytest.mark.filterwarnings("ignore")
def test_metrics_match_the_official_code_on_every_hand_made_prediction():
    same = []
    for p in PREDICTIONS:
        ours = m.loogle_scores(REFERENCE, p)
        ref = ref_scores(REFERENCE, p)
        same.append([ours[k] for k in ("bleu1", "bleu4", "rouge1", "rouge2", "rougeL")] == list(ref))
    assert same == [True] * len(PREDICTIONS)  # parity: 10 / 10 (5 metrics each)
    assert m.loogle_scores(REFERENCE, PREDICTIONS[1])["rougeL"] == 1.0
    assert 0 < m.loogle_scores(REFERENCE, PREDICTIONS[0])["bleu1"] < 1


def test_meteor_and_bertscore_are_said_not_computed_here():
    if not m.wordnet_available():
        assert "meteor" not in m.loogle_scores(REFERENCE, "Ada Voss")
    assert "bertscore" in m.NOT_COMPUTED
    assert "bertscore not computed" in get_spec("loogle.shortdep_qa").metric


def test_headline_is_rouge_l_recall():
    task = get_scorer("loogle.longdep_qa")
    res = task.score("Ada Voss", [REFERENCE], {})
    assert res.score == res.sub["rougeL"] == ref_rouge(REFERENCE, "Ada Voss")[2]
    rows = [{"score": 0.5, "bleu1": 0.25, "rougeL": 0.5}, {"score": 1.0, "bleu1": 0.75, "rougeL": 1.0}]
    assert task.aggregate(rows) == {"score": 75.0, "n": 2, "bleu1": 50.0, "rougeL": 75.0}


def test_fixture_loader_prompt_and_lengths(fixtures_dir):
    task = LooGLETask(subset="shortdep_qa", data_dir=str(fixtures_dir))
    samples = task.samples()
    assert [s.id for s in samples] == ["loogle.shortdep_qa/0/0", "loogle.shortdep_qa/0/1", "loogle.shortdep_qa/1/0"]
    assert samples[0].prefix == samples[1].prefix  # questions on one document share it (one compressed context)
    assert samples[0].prefix + samples[0].suffix == (
        "Please answer the question based on the long texts below. \n The observatory on Kell Hill was founded in 1921 "
        "by the astronomer Ada Voss. It houses a refracting telescope of 60 centimetres.\nQuestion: Who founded the "
        "observatory?\nAnswer: ")
    assert samples[0].references == ("The astronomer Ada Voss founded it in 1921.",)
    assert samples[0].max_new_tokens == 300 and LooGLETask(subset="longdep_qa", data_dir=str(fixtures_dir)).generation_length() == 500
    assert [s.id for s in LooGLETask(subset="shortdep_qa", data_dir=str(fixtures_dir), limit=2).samples()] == [s.id for s in samples[:2]]


def test_bad_and_missing_data(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        LooGLETask(subset="longdep_qa", data_dir=str(tmp_path))
    assert f"{tmp_path}/loogle/longdep_qa.jsonl" in str(e.value) and "`params: {source: hub}`" in str(e.value)
    (tmp_path / "loogle").mkdir()
    (tmp_path / "loogle/longdep_qa.jsonl").write_text('{"input": "doc", "qa_pairs": "[{\'Q\': __import__(\'os\')}]"}\n')
    with pytest.raises(DataNotFoundError, match="document 0: qa_pairs is not a Python-literal list"):
        LooGLETask(subset="longdep_qa", data_dir=str(tmp_path)).samples()
