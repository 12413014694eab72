"""`kdeval tasks` and `kdeval score` through Typer's runner."""
from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from kdeval.cli.evals_cmds import register


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_tasks_json_lists_everything():
    res = CliRunner().invoke(_app(), ["tasks", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    names = {d["name"] for d in data}
    assert len(data) == 68 and {"needle", "file", "instructions.system", "ifeval", "math500", "phonebook", "ruler.vt", "longbench.lsht", "longbench2",
                                "aime2025",
                                "infinitebench.kv_retrieval", "loogle.longdep_qa", "turns.kv", "turns.needles",
                                "turns.loogle.longdep_qa", "scbench.kv", "scbench.choice_eng"} <= names
    scbench = {d["name"] for d in data if d["benchmark"] == "scbench"}
    assert scbench == {f"scbench.{t}" for t in ("kv", "prefix_suffix", "vt", "passkey", "qa_eng", "qa_chn", "many_shot",
                                                "choice_eng", "mf", "summary", "repoqa", "summary_with_needles",
                                                "repoqa_and_kv")}
    mixed = next(d for d in data if d["name"] == "scbench.repoqa_and_kv")
    assert mixed["metric"] == "repoqa_bleu_match | substring_match by sub-task (SCBench's), per turn"
    trec = next(d for d in data if d["name"] == "longbench.trec")
    assert trec["metric"] == "classification_score" and "THUDM/LongBench" in trec["source"]


def test_score_trec_predictions(tmp_path):
    classes = ["Abbreviation", "Entity", "Human being", "Location", "Numeric value"]
    lines = [
        {"id": "a", "prediction": "Human being\nLocation", "references": ["Human being"], "all_classes": classes},
        {"id": "b", "prediction": "Entity or Location", "references": ["Location"], "all_classes": classes},
    ]
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines))
    res = CliRunner().invoke(_app(), ["score", "longbench.trec", "--predictions", str(f), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    # a: first line only -> 1.0 ; b: two classes found -> 0.5 ; aggregate round(100 * 0.75, 2)
    assert [s["score"] for s in out["samples"]] == [1.0, 0.5] and out["aggregate"]["score"] == 75.0
    table = CliRunner().invoke(_app(), ["score", "longbench.trec", "--predictions", str(f)])
    assert table.exit_code == 0 and "score=75.0" in table.output


def test_score_ruler_needs_no_data(tmp_path, monkeypatch):
    monkeypatch.delenv("KDEVAL_DATA_DIR", raising=False)
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "x", "prediction": "1234567", "references": ["1234567", "7654321"], "length": 4096}))
    res = CliRunner().invoke(_app(), ["score", "ruler.niah_multivalue", "--predictions", str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["aggregate"]["by_length"] == {"length=4096": 50.0}


def test_bad_input_exits_2_with_a_message(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "x", "prediction": "Location", "references": ["Location"]}))
    runner = CliRunner()
    res = runner.invoke(_app(), ["score", "longbench.trec", "--predictions", str(f)])
    assert res.exit_code == 2 and "all_classes" in res.output
    res = runner.invoke(_app(), ["score", "longbench.trc", "--predictions", str(f)])
    assert res.exit_code == 2 and "did you mean 'longbench.trec'" in res.output
    res = runner.invoke(_app(), ["score", "needle", "--predictions", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "file not found" in res.output
    f.write_text('{"id": "x", "prediction": 3}\n')
    res = runner.invoke(_app(), ["score", "needle", "--predictions", str(f)])
    assert res.exit_code == 2 and "field 'prediction'" in res.output
