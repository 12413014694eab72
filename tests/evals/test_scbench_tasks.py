"""SCBench's Chinese QA, math find, summary, repoqa and its two mixed tasks from fixtures in its released format:
the loaders (ids, turns, lengths, prompts), the metrics on hand-computed cases, and bad files refused at submit."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
from typer.testing import CliRunner

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.benchmarks.scbench.metrics import math_find, qa_f1_chars, rouge_lsum
from kdeval.evals.benchmarks.scbench.repoqa import best_needle, repoqa_score, sanitize
from kdeval.evals.task_run.runner import aggregate, run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import DataNotFoundError

ADD = "def add(a, b):\n    return a + b"
SCALE = "def scale(values, factor):\n    return [v * factor for v in values]"
NEEDLES = [("add", ADD), ("scale", SCALE)]


def load(name, fixtures_dir, **kw):
    task = get_task(f"scbench.{name}", data_dir=str(fixtures_dir), **kw)
    return task, task.samples()


def test_qa_chn_prompts_and_character_f1(fixtures_dir):
    task, [s] = load("qa_chn", fixtures_dir)
    assert (s.id, s.turns, s.max_new_tokens) == ("scbench.qa_chn/zh0", 2, 40)
    assert s.prefix.startswith("阅读以下书籍然后回答问题。\n\n林间小屋")
    assert s.suffix == "\n\n问题：老木匠每年春天修理什么？\n答案："
    assert s.turn(2).suffix == "\n\n问题：他的女儿叫什么名字？\n答案：" and s.turn(2).references == ("小梅",)
    # one character one token: 是 小 梅 吧 against 小 梅 -> P 1/2, R 1, F1 2/3; punctuation and spaces dropped
    assert qa_f1_chars("是小梅吧", ["小梅"]) == pytest.approx(2 / 3)
    assert qa_f1_chars("小 梅。", ["小梅"]) == 1.0 and qa_f1_chars("石桥", ["小梅"]) == 0.0
    assert task.score("村口的石桥", s.references, s.meta).score == 1.0


def test_mf_asks_what_is_the_target_and_matches_the_first_number(fixtures_dir):
    task, [s] = load("mf", fixtures_dir)
    assert (s.id, s.turns, s.max_new_tokens) == ("scbench.mf/0", 3, 5)
    assert s.prefix == "What is the largest number of the list?\n\n[12, 97, 3, 45, 60, 8]"
    assert s.suffix == "\n\nYou should answer with only one number, no other words. The largest number of the list is: "
    assert s.turn(2).suffix == ("\n\nWhat is the smallest number of the list?\n\nYou should answer with only one "
                                "number, no other words. The smallest number of the list is: ")
    assert [s.turn(t).references for t in (1, 2, 3)] == [("97",), ("3",), ("28.5",)]
    # an int label: the first number's float value truncated; a float label: compared as a float; signs unseen
    assert [math_find(p, "3") for p in ("3", "3.9 or so", "-3", "13", "none")] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [math_find(p, "28.5") for p in ("28.5", "28.50", "28", "it is 28.5")] == [1.0, 1.0, 0.0, 1.0]
    assert task.score("97.", s.references, s.meta).score == 1.0


def test_summary_is_rouge_lsum_over_lines(fixtures_dir):
    task, [s] = load("summary", fixtures_dir)
    assert (s.id, s.turns, s.max_new_tokens) == ("scbench.summary/paper0", 2, 200)
    assert s.prefix.startswith("We study lighthouses.") and s.suffix == "\n\nSummarize the paper in one sentence."
    assert s.turn(2).suffix == "\n\nNow summarize its method."
    # summary-level LCS: reference lines [the cat sat] [on the mat]; prediction lines [sat on a mat] [the cat]:
    # line 1's union LCS covers the, cat, sat; line 2's on, mat (the second "the" has no prediction token left):
    # 5 hits of 6 tokens each way -> F 5/6 (one LCS over the whole text would give 3/6)
    assert rouge_lsum("sat on a mat\nthe cat", "the cat sat\non the mat") == pytest.approx(5 / 6)
    assert rouge_lsum("", "the cat") == 0.0
    assert task.score(s.references[0], s.references, s.meta).score == pytest.approx(1.0)


def test_repoqa_turns_and_needles_by_repository(fixtures_dir):
    task, samples = load("repoqa", fixtures_dir)
    assert [(s.id, s.turns, s.max_new_tokens) for s in samples] == [("scbench.repoqa/r0", 2, 1024),
                                                                    ("scbench.repoqa/r1", 1, 1024)]
    s = samples[0]
    assert s.prefix.startswith("Based on the function description and code context, please retrieve and repeat the "
                               "exact described function from the code context in a code block wrapped by ```:\n\n"
                               "import math")
    assert s.suffix == "\n\nFunction description: adds two numbers and returns the sum."
    assert s.references == (ADD,) and s.turn(2).references == (SCALE,)
    assert (s.meta["func_name"], s.turn(2).meta["func_name"], s.meta["lang"]) == ("add", "scale", "python")
    assert s.meta["needles"] == [list(n) for n in NEEDLES]  # every function asked in this repository, not r1's
    assert [n[0] for n in samples[1].meta["needles"]] == ["distance"]
    answer = f"Here it is:\n```python\nimport os\n\n{SCALE}\n```\nDone."
    assert task.score(answer, s.turn(2).references, s.turn(2).meta).score == 1.0
    assert task.score(answer, s.references, s.meta).score == 0.0  # asked for add, gave scale


def test_repoqa_metric_sanitizes_then_needs_the_best_match_at_08():
    # the first function of the first block that has one; a block without one; no block: the stripped answer
    assert sanitize(f"```\nx = 1\n```\n```python\n# a comment\n{ADD}\n\nprint(1)\n```", "python") == ADD
    assert sanitize("```\nx = 1\n```", "python") == "x = 1\n"
    assert sanitize(f"  {ADD}\n ", "python") == ADD
    assert best_needle(ADD, NEEDLES, "python") == ("add", 1.0)
    assert best_needle("nothing alike", NEEDLES, "python") == (None, 0.0)
    name, sim = best_needle("def scale(values, factor):", NEEDLES, "python")
    assert name == "scale" and sim < 0.8  # the right function, too little of it
    assert repoqa_score("def scale(values, factor):", "scale", NEEDLES, "python") == 0.0
    assert repoqa_score(f"```python\n{SCALE}\n```", "scale", NEEDLES, "python") == 1.0


def test_summary_with_needles_scores_and_sizes_each_turn_by_its_subtask(fixtures_dir):
    task, [s] = load("summary_with_needles", fixtures_dir)
    assert (s.id, s.turns, s.max_new_tokens, s.turn_lengths) == ("scbench.summary_with_needles/mix0", 3, 800,
                                                                 (800, 15, 800))
    assert task.generation_length() == 800
    assert [s.new_tokens(t) for t in (1, 2, 3)] == [800, 15, 800]
    assert [s.turn(t).meta["subtask"] for t in (1, 2, 3)] == ["scbench_summary", "scbench_passkey", "scbench_summary"]
    assert s.prefix.startswith("Lighthouses guide ships at night.") and s.suffix == "\n\nSummarize the text."
    passkey = s.turn(2)
    assert passkey.suffix == "\n\nWhat is the pass key? The pass key is" and passkey.new_tokens() == 15
    assert [task.score(p, passkey.references, passkey.meta).score for p in ("71432.", "is 71432", "7143")] == [1, 1, 0]
    summary = s.turn(3)
    assert task.score("forty lighthouses", summary.references, summary.meta).score == pytest.approx(
        rouge_lsum("forty lighthouses", "Forty lighthouses guide ships."))
    capped = dataclasses.replace(s, max_new_tokens=20)  # a grid's max_new_tokens caps every turn's own
    assert [capped.new_tokens(t) for t in (1, 2, 3)] == [20, 15, 20]
    rows = [{"score": v, "turn": t, "meta_json": json.dumps({"subtask": k})}
            for v, t, k in ((1.0, 1, "scbench_summary"), (0.0, 2, "scbench_passkey"), (0.5, 3, "scbench_summary"))]
    assert task.aggregate(rows)["by_subtask"] == {"subtask=scbench_passkey": 0.0, "subtask=scbench_summary": 75.0}


def test_repoqa_and_kv_mixes_function_and_key_turns(fixtures_dir):
    task, [s] = load("repoqa_and_kv", fixtures_dir)
    assert (s.id, s.turns, s.turn_lengths, task.generation_length()) == ("scbench.repoqa_and_kv/mix1", 3,
                                                                        (1024, 80, 1024), 1024)
    assert s.prefix.startswith("import math")  # no instruction before the context: SCBench's "{context}\n\n{input}"
    assert s.suffix == "\n\nFunction description: adds two numbers and returns the sum."
    assert s.meta["needles"] == [list(n) for n in NEEDLES]  # the repoqa turns' functions only
    kv = s.turn(2)
    assert kv.suffix == '\n\nKey: "90de"\nThe value associated with the specified key is: '
    assert (kv.meta["subtask"], kv.meta["func_name"], kv.new_tokens()) == ("scbench_kv", None, 80)
    assert [task.score(p, kv.references, kv.meta).score for p in ("it is 3f02.", "3f0")] == [1.0, 0.0]
    fn = s.turn(3)
    assert task.score(f"```python\n{SCALE}\n```", fn.references, fn.meta).score == 1.0
    assert task.score(f"```python\n{ADD}\n```", fn.references, fn.meta).score == 0.0
    assert get_task("scbench.repoqa_and_kv", data_dir=str(fixtures_dir), max_turns=2).samples()[0].turn_lengths == (
        1024, 80)


@pytest.mark.parametrize("lang,code,function", [
    ("java", "class A {\n  int f(int x) { return x; }\n}", "int f(int x) { return x; }"),
    ("typescript", "const a = 1;\nfunction f(x: number) { return x; }", "function f(x: number) { return x; }"),
    ("rust", "use std::io;\nfn f(x: i32) -> i32 { x }", "fn f(x: i32) -> i32 { x }"),
    ("cpp", "#include <x>\nint f(int x) { return x; }", "int f(int x) { return x; }"),
    ("go", "package m\nfunc f(x int) int { return x }", "func f(x int) int { return x }"),
])
def test_repoqa_finds_the_function_in_every_language(lang, code, function):
    assert sanitize(f"```{lang}\n{code}\n```", lang) == function


@pytest.fixture(scope="module")
def tiny():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny")


@pytest.mark.parametrize("name", ["qa_chn", "mf", "summary", "repoqa", "summary_with_needles", "repoqa_and_kv"])
def test_one_multi_turn_run_per_task(tiny, fixtures_dir, name):
    task = get_task(f"scbench.{name}", data_dir=str(fixtures_dir))
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=96, chunk_size=32, max_new_tokens=4))
    assert [(r["id"], r["turn"]) for r in rows] == [(s.id, t) for s in task.samples() for t in range(1, s.turns + 1)]
    assert all(0.0 <= r["score"] <= 1.0 and r["generated_tokens"] <= 4 for r in rows)
    summary = aggregate(task, rows)
    assert summary["n"] == len(rows) and set(summary["by_turn"]) == {f"turn={r['turn']}" for r in rows}
    if name.endswith(("needles", "and_kv")):
        assert set(summary["by_subtask"]) == {f"subtask={json.loads(r['meta_json'])['subtask']}" for r in rows}
    if name.startswith("repoqa"):  # a row can be rescored alone: it carries the repository's functions
        meta = json.loads(rows[0]["meta_json"])
        assert meta["lang"] == "python" and [n[0] for n in meta["needles"]] == ["add", "scale"]


_CODE = {"repo": "a/b", "lang": "python", "context": "def f():\n    pass\n"}
_MF = "The largest number of the list is: "


@pytest.mark.parametrize("task,row,why", [
    ("mf", {"context": "[1, 2]", "multi_turns": [{"input": "Which is largest?", "answer": 2}]},
     "multi_turns[0].input: expected a math-find question naming its target as 'The ... is'"),
    ("mf", {"context": "[1, 2]", "multi_turns": [{"input": _MF, "answer": "two"}]},
     "multi_turns[0].answer: expected a number (an int or a float), got 'two'"),
    ("repoqa", {**_CODE, "lang": None, "multi_turns": [{"input": "q", "answer": "def f", "name": "f"}]},
     "field 'lang' is missing or not text"),
    ("repoqa", {**_CODE, "lang": "cobol", "multi_turns": [{"input": "q", "answer": "def f", "name": "f"}]},
     "field 'lang': expected one of python, java, typescript, rust, cpp, go, got 'cobol'"),
    ("repoqa", {**_CODE, "multi_turns": [{"input": "q", "answer": "def f"}]}, "multi_turns[0] has no field 'name'"),
    ("summary_with_needles", {"context": "c", "multi_turns": [{"input": "q", "answer": "a", "task": "scbench_summary"},
                                                             {"input": "q", "answer": "1"}]},
     "multi_turns[1] has no field 'task'"),
    ("summary_with_needles", {"context": "c", "multi_turns": [{"input": "q", "answer": "a", "task": "scbench_kv"}]},
     "multi_turns[0].task: expected one of scbench_summary, scbench_passkey, got 'scbench_kv'"),
    ("repoqa_and_kv", {**_CODE, "multi_turns": [{"input": "q", "answer": "def f", "task": "scbench_repoqa"}]},
     "multi_turns[0].name: a scbench_repoqa turn names the function it asks for"),
])
def test_bad_scbench_files_are_refused_at_submit(app, paths, monkeypatch, tmp_path, task, row, why):
    (tmp_path / "data" / "scbench").mkdir(parents=True)
    (tmp_path / "data" / "scbench" / f"scbench_{task}.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataNotFoundError, match=re.escape(f"scbench_{task}.jsonl:1: {why}")):
        get_task(f"scbench.{task}", data_dir=str(tmp_path / "data")).samples()
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(tmp_path / "data"))
    grid = tmp_path / "g.yaml"
    grid.write_text(f"models: [random:llama-tiny]\npolicies: [full]\nchunk_sizes: [32]\ntasks: [scbench.{task}]\n")
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--dry-run"], terminal_width=400)
    head, *problems = res.output.strip().splitlines()
    assert res.exit_code == 2 and head.endswith("1 problem") and len(problems) == 1, res.output
    assert problems[0].strip().startswith(f"tasks[0]: scbench.{task}") and why in problems[0]
    assert not paths["db"].exists()
