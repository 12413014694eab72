"""RULER tasks read kvpress's RULER evaluation set (a local copy in its format) as their samples: the i-th row
of a task is sample ``kvpress/ruler.<task>/L<length>/<i>``, with kvpress's context, question and answers."""
from __future__ import annotations

import json

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.tasks.base import TaskUnavailableError
from kdeval.evals.tasks.prompting import PromptBuilder

ROWS = [{"context": f"context {i} " * 20, "question": f"Question {i}?", "answer_prefix": "Answer:",
         "answer": [f"v{i}", "w"], "task": "vt" if i != 1 else "cwe", "max_new_tokens": 30} for i in range(4)]


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "kvpress" / "ruler").mkdir(parents=True)
    (tmp_path / "kvpress" / "ruler" / "4096.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return tmp_path


def test_samples_are_kvpress_rows_in_order(data_dir):
    from kdeval.zoo.loading import load_model

    lm = load_model("random:llama-tiny")
    t = get_task("ruler.vt", lengths=[4096], num_samples=2, source="kvpress", data_dir=str(data_dir))
    assert t.sample_ids() == ["kvpress/ruler.vt/L4096/0", "kvpress/ruler.vt/L4096/1"]
    assert t.data_source() == "kvpress RULER set (local copy)"
    samples = t.samples(PromptBuilder(lm.tokenizer, lm.max_context))
    assert [s.id for s in samples] == t.sample_ids()
    # the vt rows are ROWS[0], ROWS[2] (ROWS[1] is cwe)
    assert [(s.prefix, s.suffix, s.answer_prefix, s.references, s.max_new_tokens) for s in samples] == [
        (ROWS[i]["context"], ROWS[i]["question"], "Answer:", (f"v{i}", "w"), 30) for i in (0, 2)]
    assert t.score("v2 and w", ["v2", "w"], {}).score == 1.0


def test_a_missing_copy_names_the_file_and_the_hub(tmp_path):
    with pytest.raises(TaskUnavailableError, match=r"kvpress/ruler/4096\.parquet \(or \.jsonl\) not found; save "
                                                   r"simonjegou/ruler .* or use source: kvpress-hub"):
        get_task("ruler.vt", lengths=[4096], num_samples=2, source="kvpress", data_dir=str(tmp_path))
