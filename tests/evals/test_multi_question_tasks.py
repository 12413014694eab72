"""Tasks with several questions per context: generated multi-key retrieval and needles, LooGLE documents and
SCBench's released files (fixtures in its format), their metrics on hand-computed cases, and bad files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.benchmarks.scbench.metrics import any_upper_match, share_match, substring_match
from kdeval.evals.tasks.base import DataNotFoundError
from kdeval.evals.tasks.prompting import PromptBuilder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("name,params", [("turns.kv", {"kind": "uuids"}), ("turns.kv", {"kind": "numbers"}),
                                         ("turns.needles", {})])
def test_generated_turns_fit_the_length_and_ask_each_key_once(byte_tok, chat_tok, name, params):
    for tok in (byte_tok, chat_tok):
        builder = PromptBuilder(tok, 4096)
        task = get_task(name, lengths=[900], turns=4, repeats=2, **params)
        samples = task.samples(builder)
        again = get_task(name, lengths=[900], turns=4, repeats=2, **params).samples(builder)
        assert samples == again and [s.id for s in samples] == task.sample_ids()
        for s in samples:
            assert s.turns == 4
            assert 900 - 60 < builder.count(s) + s.max_new_tokens <= 900
            answers = [s.turn(t).references[0] for t in range(1, 5)]
            assert len(set(answers)) == 4 and all(a in s.prefix for a in answers)
            questions = [s.turn(t).suffix for t in range(1, 5)]
            assert len(set(questions)) == 4
        assert samples[0].prefix != samples[1].prefix
    needles = get_task("turns.needles", lengths=[900], turns=4, repeats=1).samples(PromptBuilder(byte_tok, 4096))[0]
    depths = sorted(needles.turn(t).meta["depth"] for t in range(1, 5))
    assert depths[0] == 0.0 and depths[-1] == 100.0  # spread over the whole context


def test_loogle_documents_with_their_questions(fixtures_dir):
    task = get_task("turns.loogle.shortdep_qa", data_dir=str(fixtures_dir))
    docs = task.samples()
    assert [(s.id, s.turns) for s in docs] == [("turns.loogle.shortdep_qa/0", 2), ("turns.loogle.shortdep_qa/1", 1)]
    second = docs[0].turn(2)
    assert second.suffix == "Question: What telescope does it house?\nAnswer: "
    assert second.references == ("A 60 centimetre refracting telescope.",)
    one = get_task("loogle.shortdep_qa", data_dir=str(fixtures_dir)).samples()
    assert docs[0].prefix == one[0].prefix and docs[0].suffix == one[0].suffix  # turn 1 is LooGLE's own prompt
    assert get_task("turns.loogle.shortdep_qa", data_dir=str(fixtures_dir), max_turns=1).samples()[0].turns == 1


def test_scbench_files_and_metrics(fixtures_dir):
    kv = get_task("scbench.kv", data_dir=str(fixtures_dir)).samples()
    assert [(s.id, s.turns, s.max_new_tokens) for s in kv] == [("scbench.kv/0", 3, 150), ("scbench.kv/1", 2, 150)]
    assert kv[0].prefix.startswith("Extract the value corresponding to the specified key in the JSON object below.")
    assert kv[0].turn(2).suffix.strip() == 'Key: "77b0"\nThe value associated with the specified key is:'
    assert kv[0].turn(3).references == ("b771",)
    qa = get_task("scbench.qa_eng", data_dir=str(fixtures_dir))
    [book] = qa.samples()
    assert book.turn(2).suffix == "\n\nQuestion: Where did she sell the honey?\nAnswer:"
    assert qa.score("In the market at vell.", book.turn(2).references, {}).score == 1.0
    choice = get_task("scbench.choice_eng", data_dir=str(fixtures_dir))
    [c] = choice.samples()
    assert c.references == ("blue", "B") and c.turn(2).references == ("The lighthouse keeper", "C")
    assert "C. green\nD. white\n\nThe the correct answer is" in c.suffix
    assert [choice.score(p, c.references, {}).score for p in ("B. blue", "blue", "A")] == [1.0, 1.0, 0.0]
    # SCBench's rules: kv is a substring test; QA ignores case; vt is the share of labels found, to 2 decimals
    assert substring_match("the value is 3f02.", ["3f02"]) == 1.0 and substring_match("3f0", ["3f02"]) == 0.0
    assert any_upper_match(" BEES", ["bees"]) == 1.0 and any_upper_match("wasps", ["bees"]) == 0.0
    assert share_match("VAR AB, var cd", ["AB", "CD", "EF"]) == 0.67


@pytest.mark.parametrize("row,why", [
    ({"multi_turns": [{"input": "q", "answer": "a"}]}, "field 'context' is missing"),
    ({"context": "c"}, "field 'multi_turns' is missing or empty"),
    ({"context": "c", "multi_turns": [{"input": "q", "answer": "a"}, {"input": "q2"}]},
     "multi_turns[1] has no field 'answer'"),
])
def test_scbench_file_missing_fields_is_refused_at_submit(app, paths, monkeypatch, tmp_path, row, why):
    (tmp_path / "data" / "scbench").mkdir(parents=True)
    (tmp_path / "data" / "scbench" / "scbench_kv.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataNotFoundError, match=f"scbench_kv.jsonl:1: {why}".replace("[", r"\[")):
        get_task("scbench.kv", data_dir=str(tmp_path / "data")).samples()
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(tmp_path / "data"))
    grid = tmp_path / "g.yaml"
    grid.write_text("models: [random:llama-tiny]\npolicies: [full]\nchunk_sizes: [32]\ntasks: [scbench.kv]\n")
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--dry-run"], terminal_width=400)
    assert res.exit_code == 2 and why in res.output, res.output
    assert not paths["db"].exists()
