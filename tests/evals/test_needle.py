"""Needle in a haystack: lengths, needle depth, determinism, scoring, aggregate grid."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.needle import ANSWER, NEEDLE, NeedleTask, insert_at_depth
from kdeval.evals.metrics.text import contains_answer, lcs_length, rouge_l_recall
from kdeval.evals.tasks.base import ContextTooLongError, DataNotFoundError, EvalError
from kdeval.evals.tasks.prompting import PromptBuilder


def test_text_metrics_hand_computed():
    assert lcs_length("a b c d".split(), "a c d e".split()) == 3
    # reference words [eat, sandwich, and, sit] (article "a" dropped); prediction has eat, sandwich -> 2/4
    assert rouge_l_recall("I would eat a sandwich.", "eat a sandwich and sit") == 0.5
    assert contains_answer("Well: Eat a sandwich and sit!", "eat a sandwich and sit")
    assert not contains_answer("eat a sandwiches and sit", "eat a sandwich and sit")


def test_insert_at_depth_positions():
    text = "Aa aa. Bb bb. Cc cc. Dd dd."
    assert insert_at_depth(text, "N.", 0) == ("N. " + text, 0)
    assert insert_at_depth(text, "N.", 100)[0] == text + " N."
    new, at = insert_at_depth("w " * 100, "N", 50)
    assert at == 100 and new[at] == "N"


@pytest.mark.parametrize("haystack", ["essay", "noise"])
def test_lengths_and_depths(byte_tok, data_dir, haystack):
    builder = PromptBuilder(byte_tok, max_context=4096)
    task = NeedleTask(lengths=(600, 900), depths=(0, 25, 50, 75, 100), haystack=haystack, data_dir=str(data_dir))
    samples = task.samples(builder)
    assert len(samples) == 10 and samples[7].id == "needle/L900/D50"
    for s in samples:
        total = builder.count(s) + s.max_new_tokens
        # stated tolerance: <= L and within one haystack unit (an essay word or noise sentence) of L
        assert s.meta["length"] - 24 <= total <= s.meta["length"], (s.id, total)
        text = s.prefix
        assert text.count(NEEDLE) == 1
        ctx_start = text.index("<document>\n") + len("<document>\n")
        ctx_len = len(text) - ctx_start - len(NEEDLE) - 1
        # byte tokenizer: token depth == char depth. Stated tolerance: the needle starts at or before
        # the asked depth, by at most max(2% of the context, one word of <= 16 characters)
        target = ctx_len * s.meta["depth"] / 100
        pos = text.index(NEEDLE) - ctx_start
        assert -1 <= target - pos <= max(0.02 * ctx_len, 16) + 1, (s.id, pos, target)  # -1: the joining space
    assert [s.prefix for s in task.samples(builder)] == [s.prefix for s in samples]  # deterministic


def test_auto_falls_back_to_noise_and_essay_requires_file(tmp_path):
    assert NeedleTask(data_dir=str(tmp_path)).haystack_used == "noise"
    with pytest.raises(DataNotFoundError, match="PaulGrahamEssays.json"):
        NeedleTask(haystack="essay", data_dir=str(tmp_path))


def test_bad_parameters_and_context(byte_tok):
    with pytest.raises(EvalError, match="depths"):
        NeedleTask(depths=(120,), haystack="noise")
    with pytest.raises(EvalError, match="lengths"):
        NeedleTask(lengths=(0,), haystack="noise")
    with pytest.raises(ContextTooLongError, match="exceed the model's context"):
        NeedleTask(lengths=(9000,), haystack="noise").check_context(8192)
    with pytest.raises(EvalError, match="builder"):
        NeedleTask(haystack="noise").samples()


def test_score_and_heatmap_grid():
    task = NeedleTask(haystack="noise")
    hit = task.score("eat a sandwich and sit in Dolores Park on a sunny day.", (ANSWER,), {})
    assert hit.score == 1.0 and hit.sub["rouge_l_recall"] == 1.0
    miss = task.score("sit in the park", (ANSWER,), {})
    # reference words: eat sandwich and sit in dolores park on sunny day (10); LCS "sit in park" = 3
    assert miss.score == 0.0 and miss.sub["rouge_l_recall"] == pytest.approx(0.3)
    rows = [{"score": 1.0, "rouge_l_recall": 1.0, "length": 400, "depth": 0},
            {"score": 0.0, "rouge_l_recall": 0.3, "length": 400, "depth": 50}]
    agg = task.aggregate(rows)
    assert agg["contains"] == 50.0 and agg["rouge_l_recall"] == 65.0
    assert agg["grid"] == [{"length": 400, "depth": 0.0, "contains": 100.0, "rouge_l_recall": 100.0},
                           {"length": 400, "depth": 50.0, "contains": 0.0, "rouge_l_recall": 30.0}]
