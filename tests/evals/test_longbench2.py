"""LongBench v2: the official prompt, answer extraction and result table against a re-statement of the
official code, the fixture loader, and the missing-data message."""
from __future__ import annotations

import json
import re

import pytest

from kdeval.evals.benchmarks.longbench2 import TEMPLATE, LongBench2Task, render_prompt
from kdeval.evals.benchmarks.registry import get_scorer
from kdeval.evals.metrics.longbench2 import accuracy_table, extract_choice
from kdeval.evals.tasks.base import DataNotFoundError


# --- reference: THUDM/LongBench (v2) pred.py extract_answer and result.py, restated for comparison -------------
def ref_extract_answer(response):
    response = response.replace('*', '')
    match = re.search(r'The correct answer is \(([A-D])\)', response)
    if match:
        return match.group(1)
    match = re.search(r'The correct answer is ([A-D])', response)
    return match.group(1) if match else None


def ref_result_row(preds):
    easy = hard = short = medium = long = 0
    easy_acc = hard_acc = short_acc = medium_acc = long_acc = 0
    for pred in preds:
        acc = int(pred['judge'])
        if pred["difficulty"] == "easy":
            easy += 1
            easy_acc += acc
        else:
            hard += 1
            hard_acc += acc
        if pred['length'] == "short":
            short += 1
            short_acc += acc
        elif pred['length'] == "medium":
            medium += 1
            medium_acc += acc
        else:
            long += 1
            long_acc += acc
    return [round(100 * (easy_acc + hard_acc) / len(preds), 1), round(100 * easy_acc / easy, 1),
            round(100 * hard_acc / hard, 1), round(100 * short_acc / short, 1), round(100 * medium_acc / medium, 1),
            round(100 * long_acc / long, 1)]
# --- end of reference -------------------------------------------------------------------------------------------

#: hand-made responses (pred.py strips the output before extract_answer): formats models produce
RESPONSES = [
    "The correct answer is (B)", "The correct answer is B", "**The correct answer is (C)**", "the correct answer is (A)",
    "I think (A). The correct answer is (D).", "The correct answer is (E)", "The correct answer is: (A)", "",
    "  The correct answer is (A)  \n", "The correct answer is (B) or The correct answer is (C)",
    "The correct answer is *(D)*", "The correct answer is Both", "The correct answer is (a)", "Answer: (C)",
    "The correct answer is (B\n)", "The correct answer is  (C)", "The correct answer is (C) The correct answer is D",
    "The correct answer isA",
]


def test_extraction_matches_the_official_code_on_every_hand_made_response():
    same = [extract_choice(r) == ref_extract_answer(r.strip()) for r in RESPONSES]
    assert same == [True] * len(RESPONSES)  # parity: 18 / 18
    assert extract_choice("The correct answer is (B)") == "B" and extract_choice("Answer: (C)") is None


def test_score_is_the_official_judge(fixtures_dir):
    task = get_scorer("longbench2")
    for r in RESPONSES:
        for gold in "ABCD":
            assert task.score(r, [gold], {}).score == float(ref_extract_answer(r.strip()) == gold)
    assert task.score("nothing", ["A"], {}).sub == {"answered": 0.0}


def test_result_table_matches_the_official_result_py():
    rows = [
        ("easy", "short", 1), ("easy", "short", 0), ("hard", "medium", 1), ("hard", "long", 1), ("easy", "long", 0),
        ("hard", "medium", 0), ("hard", "short", 1), ("easy", "medium", 1), ("hard", "long", 0), ("hard", "long", 1),
    ]
    ours = accuracy_table([{"score": s, "difficulty": d, "length_bucket": n} for d, n, s in rows])
    ref = ref_result_row([{"judge": bool(s), "difficulty": d, "length": n} for d, n, s in rows])
    assert [ours[k] for k in ("overall", "easy", "hard", "short", "medium", "long")] == ref == [60.0, 50.0, 66.7, 66.7, 66.7, 50.0]


def test_prompt_is_the_official_0shot_template(fixtures_dir):
    row = json.loads((fixtures_dir / "longbench2/data.json").read_text())[0]
    prefix, suffix = render_prompt(row)
    official = TEMPLATE.replace('$DOC$', row["context"].strip()).replace('$Q$', row['question'].strip()) \
        .replace('$C_A$', row['choice_A'].strip()).replace('$C_B$', row['choice_B'].strip()) \
        .replace('$C_C$', row['choice_C'].strip()).replace('$C_D$', row['choice_D'].strip())
    assert prefix + suffix == official
    assert prefix.endswith("painted green every decade.") and suffix.startswith("\n</text>\n\nWhat is the correct")
    assert TEMPLATE.startswith("Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>")
    assert TEMPLATE.endswith('Format your response as follows: "The correct answer is (insert answer here)".')


def test_loader_and_aggregate(fixtures_dir):
    task = LongBench2Task(data_dir=str(fixtures_dir))
    samples = task.samples()
    assert [s.id for s in samples] == task.sample_ids() == ["longbench2/lb2-0001", "longbench2/lb2-0002", "longbench2/lb2-0003"]
    assert [s.references for s in samples] == [("B",), ("C",), ("D",)]
    assert samples[0].max_new_tokens == task.generation_length() == 128
    rows = [{"score": sc, "meta_json": json.dumps(dict(s.meta))} for s, sc in zip(samples, (1.0, 0.0, 1.0))]
    agg = task.aggregate(rows)
    assert agg["accuracy"] == 66.7 and agg["by_difficulty"] == {"easy": 100.0, "hard": 50.0}
    assert agg["by_length"] == {"short": 100.0, "medium": 0.0, "long": 100.0}
    assert LongBench2Task(data_dir=str(fixtures_dir), limit=2).sample_ids() == task.sample_ids()[:2]


def test_missing_data_names_the_file_and_the_hub_option(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        LongBench2Task(data_dir=str(tmp_path))
    assert f"{tmp_path}/longbench2/data.json" in str(e.value) and "`params: {source: hub}`" in str(e.value)
    (tmp_path / "longbench2").mkdir()
    (tmp_path / "longbench2/data.json").write_text('[{"_id": "x", "question": "q"}]')
    with pytest.raises(DataNotFoundError, match="question 0 has no field 'choice_A'"):
        LongBench2Task(data_dir=str(tmp_path)).samples()


def test_long_prompts_are_truncated_in_the_middle_as_pred_py(fixtures_dir, byte_tok):
    from kdeval.evals.tasks.prompting import PromptBuilder

    task = LongBench2Task(data_dir=str(fixtures_dir))
    sample = task.samples()[0]
    full = byte_tok.encode(sample.prefix + sample.suffix, add_special_tokens=False)
    built = PromptBuilder(byte_tok, 300).build(sample)
    limit = 300 - 128 - 1  # context - generation - BOS
    assert built.truncated and built.removed_tokens == len(full) - limit
    body = built.ids[1:]  # pred.py keeps the first and last halves of the prompt's tokens
    assert body == full[: limit - limit // 2] + full[len(full) - limit // 2:]
