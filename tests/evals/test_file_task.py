"""The `file` task: a user's JSONL, Parquet or CSV file in kvpress's dataset layout read as it is (or mapped),
its prompt from a template of named fields, the question kept apart from the context, a metric of the registry,
its bytes in the cell's identity; bad data one line naming the file and what was expected."""
from __future__ import annotations

import json

import pytest

from kdeval.evals import get_spec
from kdeval.evals.metrics.registry import get_metric, metric_names
from kdeval.evals.tasks import table_file
from kdeval.evals.tasks.base import EvalError
from kdeval.evals.tasks.identity import task_data

ROWS = [
    {"context": "Alpha. The code is 4471. Omega.", "question": "What is the code?", "answer_prefix": "Answer: ",
     "answer": "4471", "task": "codes", "max_new_tokens": 5},
    {"context": "Marta's cat is Pistachio.", "question": "Name the cat.", "answer_prefix": "Answer: ",
     "answer": ["Pistachio", "Pist"], "task": "pets", "max_new_tokens": 7},
]


def write_jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def build(**params):
    return get_spec("file").build(**params)


def test_kvpress_layout_read_as_it_is_from_jsonl_parquet_and_csv(tmp_path):
    import pandas as pd

    jsonl = write_jsonl(tmp_path / "d.jsonl")
    frame = pd.DataFrame(ROWS[:1] * 2)
    frame.to_parquet(tmp_path / "d.parquet")
    frame.to_csv(tmp_path / "d.csv", index=False)
    s = build(path=str(jsonl)).samples()
    assert [x.id for x in s] == ["file/0", "file/1"]
    assert s[0].prefix == "Alpha. The code is 4471. Omega." and s[0].suffix == "\n\nWhat is the code?"
    assert s[0].references == ("4471",) and s[1].references == ("Pistachio", "Pist")
    assert s[0].answer_prefix == "Answer: " and [x.max_new_tokens for x in s] == [5, 7]
    assert s[1].meta["task"] == "pets" and "context" not in s[1].meta
    for other in ("d.parquet", "d.csv"):
        t = build(path=str(tmp_path / other))
        assert [(x.prefix, x.suffix, x.references) for x in t.samples()] == [(s[0].prefix, s[0].suffix, ("4471",))] * 2
    assert build(path=str(jsonl)).generation_length() == 7


def test_a_field_mapping_a_template_and_a_metric(tmp_path):
    rows = [{"passage": "P1 text", "q": "Q1?", "gold": ["yes"], "source": "wiki"}]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    task = build(path=str(path), fields={"context": "passage", "question": "q", "answers": "gold"},
                 template="Read ({source}):\n{context}\nQuestion: {question}\nAnswer:", metric="exact_match",
                 max_new_tokens=3)
    (s,) = task.samples()
    assert (s.prefix, s.suffix) == ("Read (wiki):\nP1 text", "\nQuestion: Q1?\nAnswer:")
    assert s.max_new_tokens == 3 and task.generation_length() == 3
    assert task.score("Yes.", s.references, s.meta).score == 1.0 and task.score("no", s.references, s.meta).score == 0
    assert set(metric_names()) >= {"string_match_part", "qa_f1", "rouge_l", "exact_match", "contains"}
    assert get_metric("qa_f1")("the 4471", ["4471"]) == pytest.approx(1.0)


def test_the_data_digest_follows_the_file_bytes(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl")
    before = task_data(build(path=str(path)), 2, None)
    assert before.source == "file d.jsonl" and before.sample_ids == ("file/0", "file/1")
    write_jsonl(path, [dict(ROWS[0], answer="4472"), ROWS[1]])
    after = task_data(build(path=str(path)), 2, None)
    assert after.digest != before.digest and after.sample_ids == before.sample_ids


@pytest.mark.parametrize("case, params, message", [
    ("missing", {}, "path: d.jsonl: row 0 has no column 'answer' (the sample's answers; map another with "
                    "fields.answers; columns: context, question)"),
    ("empty", {}, "path: d.jsonl is empty; expected at least one row"),
    ("nofile", {}, "path: no such file: "),
    ("template", {"template": "{context} {missing}"}, "template: field {missing} is no column of d.jsonl"),
    ("twice", {"template": "{context} {context}"}, "template: expected the field {context} exactly once"),
    ("attr", {"template": "{context} {question.upper}"}, "template: field {question.upper}: expected a column name"),
    ("metric", {"metric": "f1"}, "metric: unknown 'f1'"),
    ("fields", {"fields": {"contxt": "c"}}, "fields.contxt: unknown; expected some of context, question"),
])
def test_bad_data_is_one_line_naming_the_file_or_field(tmp_path, case, params, message):
    path = tmp_path / "d.jsonl"
    if case == "missing":
        write_jsonl(path, [{"context": "c", "question": "q"}])
    elif case == "empty":
        path.write_text("")
    elif case != "nofile":
        write_jsonl(path)
    with pytest.raises(EvalError) as e:
        build(path=str(path), **params)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "big.jsonl")
    monkeypatch.setattr(table_file, "MAX_FILE_BYTES", 64)
    reads = []
    monkeypatch.setattr(table_file, "jsonl_objects", lambda *a: reads.append(a) or iter(()))
    with pytest.raises(EvalError, match=r"path: big.jsonl holds 0.0 GiB; expected at most 0 GiB"):
        build(path=str(path))
    assert not reads


def test_a_relative_path_is_read_from_the_working_directory_or_else_the_data_directory(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "mine").mkdir(parents=True)
    write_jsonl(data / "mine" / "d.jsonl")
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(data))
    monkeypatch.chdir(tmp_path)
    assert len(build(path="mine/d.jsonl").samples()) == 2  # not in the working directory: the data directory's
    write_jsonl(tmp_path / "mine.jsonl", ROWS[:1])
    assert len(build(path="mine.jsonl").samples()) == 1
