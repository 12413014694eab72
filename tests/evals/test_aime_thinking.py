"""AIME 2025 (graded like MATH-500) and ``thinking: strip`` (a reasoning model's thinking block removed before
scoring, the raw output kept)."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.aime2025 import Aime2025Task
from kdeval.evals.benchmarks.math500 import REASONING_MAX_NEW_TOKENS
from kdeval.evals.benchmarks.registry import get_scorer, get_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import DataNotFoundError, EvalError, Sample
from kdeval.evals.tasks.thinking import scored_text, strip_thinking, thinking_markers


# --- reference: NVIDIA/kvpress evaluation/benchmarks/aime25/calculate_metrics.py score_aime, restated ----------
def ref_score_aime(pred_answer, true_answer):
    return str(pred_answer.split("boxed{")[-1].split("}")[0]) == str(true_answer)
# --- end of reference -------------------------------------------------------------------------------------------

#: hand-made outputs whose answer is an integer written plainly, as AIME answers are
AIME_OUTPUTS = [
    ("So the remainder is $\\boxed{9}$.", "9"), ("\\boxed{8} no wait \\boxed{9}", "9"), ("The answer is 9.", "9"),
    ("\\boxed{30}", "30"), ("\\boxed{31}", "30"), ("\\boxed{210}", "210"), ("First \\boxed{210}, then \\boxed{209}", "210"),
    ("\\boxed{9}", "90"),
]


def test_aime_scores_match_kvpress_on_plain_integer_answers():
    task = get_scorer("aime2025")
    same = [task.score(out, [gold], {}).score == float(ref_score_aime(out, gold)) for out, gold in AIME_OUTPUTS]
    assert same == [True] * len(AIME_OUTPUTS)  # parity: 8 / 8
    # graded like MATH-500 (math equivalence): a spaced or zero-padded integer is still right (kvpress's split is not)
    assert task.score("\\boxed{ 9 }", ["9"], {}).score == 1.0 and not ref_score_aime("\\boxed{ 9 }", "9")


def test_aime_loader_and_length(fixtures_dir):
    task = Aime2025Task(data_dir=str(fixtures_dir))
    samples = task.samples()
    assert [s.id for s in samples] == task.sample_ids() == ["aime2025/I-1", "aime2025/I-2", "aime2025/II-1"]
    assert [s.references for s in samples] == [("9",), ("30",), ("210",)]
    assert samples[0].suffix == "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert task.generation_length() == REASONING_MAX_NEW_TOKENS == 32768
    assert [s.id for s in Aime2025Task(data_dir=str(fixtures_dir), limit=2, max_new_tokens=64).samples()] == task.sample_ids()[:2]
    agg = task.aggregate([{"score": 1.0, "has_boxed": 1.0}, {"score": 0.0, "has_boxed": 1.0}, {"score": 0.0, "has_boxed": 0.0}])
    assert agg == {"accuracy": 33.33, "boxed_rate": 66.67, "n": 3}


def test_aime_missing_data(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        Aime2025Task(data_dir=str(tmp_path))
    assert f"{tmp_path}/aime2025/aime2025-I.jsonl" in str(e.value) and "`params: {source: hub}`" in str(e.value)


@pytest.mark.parametrize("text,expected", [
    ("<think>so 7^100 ...</think>\n\nThe answer is \\boxed{9}.", "The answer is \\boxed{9}."),
    ("so 7^100 ... \\boxed{8}</think>\\boxed{9}", "\\boxed{9}"),  # the template opened the block: only the close
    ("<think>a</think> mid <think>b</think> end", "end"),  # the last block ends the thinking
    ("<think>still thinking \\boxed{8}", ""),  # ran out of tokens while thinking: no answer
    ("no markers \\boxed{9}", "no markers \\boxed{9}"),
])
def test_strip_thinking(text, expected):
    assert strip_thinking(text) == expected
    assert scored_text(text, "keep") == text


def test_markers_come_from_the_tokenizer():
    class Tok:
        chat_template = "{{ '<|im_start|>assistant\\n' }}"

        def __init__(self, added):
            self.added = added

        def get_added_vocab(self):
            return {t: i for i, t in enumerate(self.added)}

    assert thinking_markers(Tok(["<|begin_of_thought|>", "<|end_of_thought|>"])) == ("<|begin_of_thought|>", "<|end_of_thought|>")
    assert thinking_markers(Tok(["<think>", "</think>"])) == ("<think>", "</think>")
    assert thinking_markers(Tok([])) == ("<think>", "</think>")  # none declared: the common pair
    with pytest.raises(EvalError, match="generation.thinking: expected 'keep' or 'strip', got 'drop'"):
        scored_text("x", "drop")


def test_row_scores_the_stripped_answer_and_keeps_the_raw_prediction():
    from kdeval.evals.task_run.rows import result_row
    from kdeval.evals.tasks.prompting import BuiltPrompt

    task = get_scorer("math500")
    sample = Sample(id="s", prefix="p", suffix="q", references=("9",), max_new_tokens=8)
    prompt = BuiltPrompt((1,), (2,), False, 0, False)
    raw = "<think>maybe \\boxed{8}</think> so \\boxed{9}"
    kept = result_row(task, sample, prompt, raw, 9, {}, False, 0.0)
    stripped = result_row(task, sample, prompt, raw, 9, {}, False, 0.0, strip=("<think>", "</think>"))
    assert kept["score"] == 1.0 and "answer" not in kept  # the last box of the whole output happens to be right
    unfinished = "<think>maybe \\boxed{9}"
    assert result_row(task, sample, prompt, unfinished, 9, {}, False, 0.0)["score"] == 1.0
    row = result_row(task, sample, prompt, unfinished, 9, {}, False, 0.0, strip=("<think>", "</think>"))
    assert row["score"] == 0.0 and row["answer"] == "" and row["prediction"] == unfinished
    assert stripped["prediction"] == raw and stripped["answer"] == "so \\boxed{9}" and stripped["score"] == 1.0


def test_run_task_with_thinking_strip_adds_the_answer_column(fixtures_dir):
    from kdeval.evals.task_run.runner import run_task
    from kdeval.zoo.loading import load_model

    tiny = load_model("random:llama-tiny")
    task = get_task("aime2025", data_dir=str(fixtures_dir), limit=1, max_new_tokens=4)
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, thinking="strip"))
    assert rows[0]["answer"] == strip_thinking(rows[0]["prediction"])
    assert "answer" not in run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32))[0]
    with pytest.raises(EvalError, match="thinking: expected 'keep' or 'strip'"):
        run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, thinking="yes"))
