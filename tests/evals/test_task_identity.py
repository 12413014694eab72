"""What a task says about itself before a model loads (cell identity, dry runs) matches what it runs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.tasks.identity import data_digest, task_data
from kdeval.evals.tasks.prompting import PromptBuilder

DATA = os.environ.get("KDEVAL_DATA_DIR")


@pytest.mark.parametrize("name, params", [
    ("needle", {"lengths": [600, 900], "depths": [0, 37.5, 100], "haystack": "noise"}),
    ("phonebook", {"lengths": [700], "num_books": 2, "questions_per_book": 3}),
    ("ruler.niah_single_1", {"lengths": [600], "num_samples": 3}),
    ("ruler.vt", {"lengths": [3000], "num_samples": 2}),
    ("ruler.cwe", {"lengths": [3000], "num_samples": 2}),
])
def test_sample_ids_without_a_tokenizer_equal_the_built_samples(name, params, byte_tok):
    task = get_task(name, **params)
    built = [s.id for s in task.samples(PromptBuilder(byte_tok, 4096))]
    assert task.sample_ids() == built and len(set(built)) == len(built)


def test_file_tasks_list_their_ids_and_digest_their_bytes(fixtures_dir, tmp_path):
    src = fixtures_dir / "longbench"
    name = sorted(p.stem for p in src.glob("*.jsonl"))[0]
    (tmp_path / "longbench").mkdir()
    target = tmp_path / "longbench" / f"{name}.jsonl"
    target.write_bytes((src / f"{name}.jsonl").read_bytes())
    task = get_task(f"longbench.{name}", data_dir=str(tmp_path))
    info = task_data(task, samples=2, max_new_tokens=None)
    assert info.sample_ids == tuple(s.id for s in task.samples())[:2]
    assert info.source == f"longbench/{name}.jsonl" and info.generation_length == task.generation_length()
    before = info.digest
    target.write_bytes(target.read_bytes() + b"\n")
    assert data_digest(get_task(f"longbench.{name}", data_dir=str(tmp_path))) != before
    assert task_data(task, samples=2, max_new_tokens=5).generation_length == 5


def test_hub_sources_have_no_ids_before_fetching():
    task = get_task("math500", source="hub")
    info = task_data(task, samples=4, max_new_tokens=None)
    assert info.sample_ids is None and info.source == "hub HuggingFaceH4/MATH-500"
    assert info.generation_length == 1024


@pytest.mark.skipif(not DATA or not (Path(DATA) / "haystack").is_dir(), reason="needs KDEVAL_DATA_DIR (make test sets it)")
def test_needle_digest_follows_the_haystack_it_resolved():
    essay = get_task("needle", lengths=[600], haystack="auto")
    noise = get_task("needle", lengths=[600], haystack="noise")
    assert essay.data_source().startswith("essay haystack") and noise.data_source().startswith("noise haystack")
    assert data_digest(essay) != data_digest(noise)
    assert [rel for rel, _ in essay.data_files()] == ["haystack/PaulGrahamEssays.json"]
