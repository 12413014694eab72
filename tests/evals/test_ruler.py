"""RULER: generators (length, determinism, needles present), metrics, QA availability."""
from __future__ import annotations

import json

import pytest

from kdeval.evals.benchmarks.ruler import SYNTHETIC_TASKS, RulerTask
from kdeval.evals.metrics.string_match import postprocess_pred, string_match_all, string_match_part
from kdeval.evals.tasks.base import ContextTooLongError, EvalError, TaskUnavailableError
from kdeval.evals.tasks.prompting import PromptBuilder

# stated tolerance: prompt + tokens_to_generate <= L and > L - one haystack unit; with one token
# per byte the longest unit is a uuid needle line (~112 bytes)
TOLERANCE = 120


def test_metrics_hand_computed():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert string_match_all("ABC-def", ["abc-DEF"]) == 1.0
    assert string_match_part("it is 456", ["123", "456"]) == 1.0
    assert string_match_part("nothing", ["123", "456"]) == 0.0
    assert postprocess_pred("  a\tb\x01c \n") == "a\nb\nc"


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
def test_generated_lengths_and_determinism(byte_tok, data_dir, name):
    builder = PromptBuilder(byte_tok, max_context=8192)
    length = 2600 if name in ("vt", "cwe") else 1500
    task = RulerTask(name, lengths=(length,), num_samples=2, data_dir=str(data_dir))
    samples = task.samples(builder)
    assert [s.id for s in samples] == [f"ruler.{name}/L{length}/0", f"ruler.{name}/L{length}/1"]
    for s in samples:
        total = builder.count(s) + s.max_new_tokens
        assert length - TOLERANCE < total <= length, (s.id, total)
        text = s.prefix + s.suffix
        if name != "cwe" and name != "fwe":
            assert all(ref in text for ref in s.references)
    again = RulerTask(name, lengths=(length,), num_samples=2, data_dir=str(data_dir)).samples(builder)
    assert [(s.prefix, s.suffix, s.references) for s in again] == [(s.prefix, s.suffix, s.references) for s in samples]
    other = RulerTask(name, lengths=(length,), num_samples=1, seed=7, data_dir=str(data_dir)).samples(builder)
    assert other[0].references != samples[0].references


def test_niah_single_wording_and_answers(byte_tok, data_dir):
    s = RulerTask("niah_single_1", lengths=(1000,), num_samples=1).samples(PromptBuilder(byte_tok, 4096))[0]
    assert s.prefix.startswith("A special magic number is hidden within the following text. Make sure to memorize it. "
                               "I will quiz you about the number afterwards.\n")
    key = s.suffix.split(" for ")[1].split(" mentioned")[0]
    assert s.suffix == f"\nWhat is the special magic number for {key} mentioned in the provided text?"
    assert s.answer_prefix == f" The special magic number for {key} mentioned in the provided text is"
    assert f"One of the special magic numbers for {key} is: {s.references[0]}." in s.prefix
    assert len(s.references[0]) == 7 and s.max_new_tokens == 128


def test_multivalue_and_cwe_answers(byte_tok, data_dir):
    mv = RulerTask("niah_multivalue", lengths=(1500,), num_samples=1, data_dir=str(data_dir)).samples(PromptBuilder(byte_tok, 4096))[0]
    assert len(mv.references) == 4 and "What are all the special magic numbers for" in mv.suffix
    cwe = RulerTask("cwe", lengths=(2600,), num_samples=1).samples(PromptBuilder(byte_tok, 4096))[0]
    body = cwe.prefix.split("\n")[-1]  # the numbered list of the asked question (after the worked example)
    words = [w for w in body.split() if not w.endswith(".")]
    counts = {w: words.count(w) for w in set(words)}
    assert len(cwe.references) == 10 and all(counts[w] == 6 for w in cwe.references)  # < 4096: 6 vs 1
    assert max(c for w, c in counts.items() if w not in cwe.references) == 1


def test_score_aggregate_and_errors(data_dir):
    task = RulerTask("niah_multivalue", lengths=(2048,), num_samples=1, data_dir=str(data_dir))
    assert task.score(" 1234567, 7654321\n", ["1234567", "7654321", "1111111", "2222222"], {}).score == 0.5
    agg = task.aggregate([{"score": 1.0, "length": 2048}, {"score": 0.5, "length": 2048}, {"score": 0.0, "length": 4096}])
    assert agg == {"score": 50.0, "n": 3, "by_length": {"length=2048": 75.0, "length=4096": 0.0}}
    with pytest.raises(ContextTooLongError, match="exceed"):
        task.check_context(1024)
    with pytest.raises(EvalError, match="task: unknown RULER task 'niah_single'"):
        RulerTask("niah_single")


def test_qa_skipped_with_clear_message_when_data_absent(tmp_path):
    with pytest.raises(TaskUnavailableError, match=r"qa_1 skipped.*ruler/squad\.json"):
        RulerTask("qa_1", data_dir=str(tmp_path))


def test_qa_from_local_official_file(tmp_path, byte_tok):
    (tmp_path / "ruler").mkdir()
    paragraphs = [{"context": f"Paragraph {i} says the code is {1000 + i}.",
                   "qas": [{"question": f"What is code {i}?", "is_impossible": False, "answers": [{"text": str(1000 + i)}]}]}
                  for i in range(30)]
    (tmp_path / "ruler" / "squad.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    task = RulerTask("qa_1", lengths=(900,), num_samples=2, data_dir=str(tmp_path))
    s = task.samples(PromptBuilder(byte_tok, 4096))[1]
    assert s.references == ("1001",) and "Paragraph 1 says the code is 1001." in s.prefix
    assert s.suffix.endswith("Question: What is code 1?") and s.answer_prefix == " Answer:"
    assert task.score("1001", s.references, {}).score == 1.0
