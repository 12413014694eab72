"""InfiniteBench: scores against a re-statement of the official compute_scores.py on hand-made predictions, the
official templates, the fixture loader, and the offline generation of the synthetic tasks."""
from __future__ import annotations

import re
import string
from collections import Counter

import pytest

from kdeval.evals.benchmarks.infinitebench.generated import InfiniteBenchSyntheticTask, number_string_key
from kdeval.evals.benchmarks.infinitebench.task import InfiniteBenchTask
from kdeval.evals.benchmarks.registry import get_scorer
from kdeval.evals.tasks.base import DataNotFoundError
from kdeval.evals.tasks.prompting import PromptBuilder


# --- reference: OpenBMB/InfiniteBench src/compute_scores.py, restated for comparison ---------------------------
def ref_normalize_answer(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def ref_f1(prediction, ground_truth):
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def ref_qa_f1_score(pred, ground_truths):
    f1 = 0
    for ground_truth in ground_truths:
        f1 = max(f1, ref_f1(ref_normalize_answer(pred).split(), ref_normalize_answer(ground_truth).split()))
    return f1


def ref_first_int_match(prediction):
    for item in re.split("[^0-9]", prediction):
        if item != "":
            return item
    return ""


def ref_kv_retrieval(pred, label):
    for c in ['\n', ':', '"', "'", '.', ',', '?', '!', '{', '}']:
        pred = pred.replace(c, ' ')
    return label in pred.split()


def ref_choice(pred, label):
    pred = pred.strip()
    if pred == "":
        return False
    if pred[0] in "ABCD":
        return pred[0] in label
    if pred in label:
        return True
    for c in ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    for prefix in ["answer is:", "answer:", "answer is", "option is"]:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        if len(pred) < idx + len(prefix) + 1:
            return False
        after_prefix = pred[idx + len(prefix) + 1:]
        for s in label:
            if after_prefix.startswith(s):
                return True
        return False
    for word in pred.split():
        if word in "ABCD":
            return word in label
    return False
# --- end of reference -------------------------------------------------------------------------------------------

DIGIT_PREDS = ["71432", " 71432.", "The pass key is 71432", "key 7 1432", "071432", "", "no digits", "71432 or 12345",
               "1.71432", "The sequence of digits is 2200012222.", "2200012222", "220001222"]
DIGIT_LABELS = ["71432", "2200012222"]
KV_PREDS = ['"a1b2-c3"', "The value is a1b2-c3.", "a1b2-c3x", "{a1b2-c3}", "value: 'a1b2-c3'!", "a1b2 c3", "",
            "a1b2-c3\nmore"]
QA_PREDS = ["Elsbeth", "her grandmother, Elsbeth.", "The grandmother", "Tuesday at dawn", "", "An Elsbeth the",
            "elsbeth elsbeth", "Mira"]
QA_LABELS = [["her grandmother Elsbeth", "Elsbeth"], ["Tuesday"]]
MC_PREDS = ["B", "B. Baking bread", " b", "Baking bread", "The answer is: B", "The answer is B", "I think the option is C",
            "answer:", "Hmm, B is right", "Option AB then B", "It is D.", "", "Baking", "answer: Baking bread",
            "The correct option is:", "C A"]
MC_LABEL = ["Baking bread", "B"]


def test_scores_match_the_official_code_on_every_hand_made_prediction():
    ours_ref = []
    passkey, kv, qa, mc = (get_scorer(f"infinitebench.{t}") for t in ("passkey", "kv_retrieval", "en_qa", "en_mc"))
    for p in DIGIT_PREDS:
        for label in DIGIT_LABELS:
            ours_ref.append((passkey.score(p, [label], {}).score, float(label == ref_first_int_match(p))))
    for p in KV_PREDS:
        ours_ref.append((kv.score(p, ["a1b2-c3"], {}).score, float(ref_kv_retrieval(p, "a1b2-c3"))))
    for p in QA_PREDS:
        for labels in QA_LABELS:
            ours_ref.append((qa.score(p, labels, {}).score, float(ref_qa_f1_score(p, labels))))
    for p in MC_PREDS:
        ours_ref.append((mc.score(p, MC_LABEL, {}).score, float(ref_choice(p, MC_LABEL))))
    assert len(ours_ref) == 24 + 8 + 16 + 16
    assert [a == b for a, b in ours_ref] == [True] * len(ours_ref)  # parity: 64 / 64
    assert sum(b for _, b in ours_ref) > 10 and any(0 < b < 1 for _, b in ours_ref)  # the cases are not all zero


def test_number_string_score_is_the_passkey_rule():
    ns = get_scorer("infinitebench.number_string")
    assert ns.score("2200012222", ["2200012222"], {}).score == 1.0
    assert ns.score("22000 12222", ["2200012222"], {}).score == 0.0


def test_fixture_loader_and_official_templates(fixtures_dir):
    qa = InfiniteBenchTask(subset="en_qa", data_dir=str(fixtures_dir))
    s = qa.samples()[0]
    assert s.prefix + s.suffix == ("Read the book and answer the question. Be very concise in your answer.\n\n"
                                   "Chapter 1. Mira kept a brass compass that had belonged to her grandmother Elsbeth."
                                   "\n\nQuestion: Whose compass did Mira keep?\nAnswer:")
    assert s.references == ("her grandmother Elsbeth", "Elsbeth") and s.max_new_tokens == 40
    mc = InfiniteBenchTask(subset="en_mc", data_dir=str(fixtures_dir))
    s = mc.samples()[1]
    assert s.suffix == ("\n\nQuestion: Where did the oil come from?\nA. The harbour\nB. A farm\n"
                        "C. The chandler on Ash Street\nD. The church\n\nThe letter of the correct answer is")
    assert s.references == ("The chandler on Ash Street", "C")
    assert mc.sample_ids() == ["infinitebench.en_mc/0", "infinitebench.en_mc/1"]


def test_missing_data_names_the_file_and_the_hub_option(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        InfiniteBenchTask(subset="en_mc", data_dir=str(tmp_path))
    assert f"{tmp_path}/infinitebench/longbook_choice_eng.jsonl" in str(e.value)
    assert "`params: {source: hub}`" in str(e.value)


def test_synthetic_recipe_is_deterministic_and_fits_the_length(byte_tok):
    builder = PromptBuilder(byte_tok, 4096)
    for subset in ("passkey", "number_string", "kv_retrieval"):
        task = InfiniteBenchSyntheticTask(subset=subset, lengths=[1500], depths=[0, 50, 100], repeats=2)
        a, b = task.samples(builder), InfiniteBenchSyntheticTask(subset=subset, lengths=[1500], depths=[0, 50, 100],
                                                                  repeats=2).samples(builder)
        assert [(s.prefix, s.suffix, s.references) for s in a] == [(s.prefix, s.suffix, s.references) for s in b]
        assert [s.id for s in a] == task.sample_ids() and len(a) == 6
        for s in a:
            total = builder.count(s) + s.max_new_tokens
            assert 1500 - 200 < total <= 1500  # one unit (a noise line or a UUID pair) below the length at most
            assert s.references[0] in s.prefix
        assert len({s.references[0] for s in a}) > 1  # each sample has its own key
        other = InfiniteBenchSyntheticTask(subset=subset, lengths=[1500], depths=[0], seed=7).samples(builder)[0]
        assert other.references != a[0].references


def test_synthetic_depth_places_the_answer(byte_tok):
    builder = PromptBuilder(byte_tok, 4096)
    task = InfiniteBenchSyntheticTask(subset="passkey", lengths=[2000], depths=[0, 100])
    first, last = task.samples(builder)
    assert "\n\nThe pass key is" in first.prefix[:200] and first.suffix.endswith("What is the pass key?\n\nThe pass key is")
    assert last.prefix.rstrip("\n").endswith("is the pass key.")
    kv = InfiniteBenchSyntheticTask(subset="kv_retrieval", lengths=[2000], depths=[0]).samples(builder)[0]
    assert kv.prefix.startswith("Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{")
    key = re.search(r'Key: "([0-9a-f-]{36})"', kv.suffix).group(1)
    assert kv.prefix.index(key) < 100 and kv.prefix.index(key) < kv.prefix.index(kv.references[0])


def test_number_string_key_follows_the_recipe():
    import random

    for seed in range(20):
        key = number_string_key(random.Random(seed))
        assert len(key) == 10 and key.isdigit()
        assert any(key[i] == key[i + 1] for i in range(9))  # each insertion copies a digit next to itself
