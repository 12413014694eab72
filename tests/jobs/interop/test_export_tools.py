"""``kdeval export --format kvpress | lm-eval``: kvpress result directories and lm-evaluation-harness results and
samples files, checked field by field; the kvpress export read back with pandas as kvpress's RULER scorer reads
a predictions.csv; bad input exits 2 writing nothing."""
from __future__ import annotations

import ast
import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from kdeval.cli import export_cmds
from kdeval.jobs.interop import export as export_job
from kdeval.jobs.interop.export import DIR_FORMATS
from kdeval.jobs.interop.export_dir import FILES, export_dir
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run
from tests.support.helpers import cli_app

runner = CliRunner()
CTX = {"compress": "context", "decode": "evict"}
PRED = ["the value is 12345 and 777", "I think 12345", "nothing", "777 12345"]
REFS = [["12345", "777"], ["12345", "777"], ["12345"], ["777", "12345"]]


def ruler_rows(scores):
    return rows(scores, task="ruler.vt", length=4096,
                extra=lambda i: {"prediction": PRED[i], "references": REFS[i], "resolved_budget": 1000,
                                 "prompt_tokens": 4000 + i, "compressed_tokens": 3990 + i, "prompt_hash": f"h{i}"})


@pytest.fixture
def run(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [
        FakeCell("full", None, task="ruler.vt", length=4096, chunk=0, rows=ruler_rows([1, 0.5, 0, 1])),
        FakeCell("full", None, task="ruler.vt", length=4096, chunk=64, rows=ruler_rows([1, 0.5, 0, 1])),
        FakeCell("keydiff", "25%", task="ruler.vt", length=4096, chunk=0, rows=ruler_rows([1, 0.5, 0, 1])),
        FakeCell("snapkv", 1000, task="ruler.vt", length=4096, chunk=64, protocol=CTX,
                 rows=ruler_rows([1, 0.5, 0, 0])),
        FakeCell("keydiff", "25%", task="needle", length=1024, chunk=0, rows=rows([1, 0, 1])),
    ])
    yield idx, tmp_path
    idx.close()


def kvpress_ruler_metric(df: pd.DataFrame) -> dict:
    """kvpress's RULER scorer as its calculate_metrics reads predictions (written here from its description)."""
    out = {}
    for task, part in df.groupby("task"):
        preds = [p.strip().lower() for p in part["predicted_answer"].fillna("")]
        refs = [ast.literal_eval(a) for a in part["answer"]]
        if task.split("_")[0] == "qa":
            hits = [max(float(r.lower() in p) for r in ref) for p, ref in zip(preds, refs)]
        else:
            hits = [sum(float(r.lower() in p) for r in ref) / len(ref) for p, ref in zip(preds, refs)]
        out[task] = {"string_match": round(sum(hits) / len(hits) * 100, 2)}
    return out


def test_kvpress_directories_files_and_fields(run):
    idx, tmp = run
    done, out, names = export_dir(idx, "r1", "kvpress", tmp / "kv")
    assert names == ["needle_in_haystack__m__keydiff__0.75__query_aware", "ruler__4096__m__keydiff__0.75__query_aware",
                     "ruler__4096__m__no_press__0.00", "ruler__4096__m__no_press__0.00__kdeval_chunk64",
                     "ruler__4096__m__snapkv__0.75__kdeval_chunk64"]
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        assert sorted(p.name for p in (out / name).iterdir()) == ["config.yaml", "metrics.json", "predictions.csv"]
    d = out / "ruler__4096__m__keydiff__0.75__query_aware"
    df = pd.read_csv(d / "predictions.csv")
    assert list(df.columns) == ["id", "task", "answer", "predicted_answer", "compression_ratio", "score",
                                "prompt_tokens", "resolved_budget"]
    assert list(df["task"]) == ["vt"] * 4 and list(df["predicted_answer"]) == PRED
    assert [ast.literal_eval(a) for a in df["answer"]] == REFS and set(df["compression_ratio"]) == {0.75}
    metrics = json.loads((d / "metrics.json").read_text())
    assert metrics == kvpress_ruler_metric(df) == {"vt": {"string_match": 62.5}}  # (1 + 0.5 + 0 + 1) / 4
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert (cfg["dataset"], cfg["data_dir"], cfg["model"], cfg["press_name"], cfg["compression_ratio"],
            cfg["query_aware"]) == ("ruler", "4096", "m", "keydiff", 0.75, True)
    assert cfg["kdeval"]["computed_by"] == "kdeval" and cfg["kdeval"]["cells"][0]["chunk_size"] == 0
    # a token budget: each row's ratio is 1 - N / (tokens compressed), the directory's their mean
    snap = pd.read_csv(out / "ruler__4096__m__snapkv__0.75__kdeval_chunk64" / "predictions.csv")
    assert list(snap["compression_ratio"]) == pytest.approx([1 - 1000 / (3990 + i) for i in range(4)])
    full = yaml.safe_load((out / "ruler__4096__m__no_press__0.00" / "config.yaml").read_text())
    assert (full["press_name"], full["compression_ratio"], full["query_aware"]) == ("no_press", 0.0, False)
    needle = json.loads((out / names[0] / "metrics.json").read_text())
    assert needle == {"needle": {"kdeval_score": 66.67}}


def test_lmeval_results_and_samples(run):
    idx, tmp = run
    date = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
    _, out, folders = export_dir(idx, "r1", "lm-eval", tmp / "lm", date=date)
    name = "m,kv=keydiff,N=25%,B=whole,query-aware"
    assert folders == ["m,kv=full,B=64", "m,kv=full,B=whole", name, "m,kv=snapkv,N=1000,B=64,query-agnostic"]
    files = sorted(p.name for p in (out / name).iterdir())
    assert files == ["results_2026-12-01T12-00-00.json", "samples_needle_1024_2026-12-01T12-00-00.jsonl",
                     "samples_ruler.vt_4096_2026-12-01T12-00-00.jsonl"]
    res = json.loads((out / name / files[0]).read_text())
    assert list(res)[:7] == ["results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                             "n-samples"]
    r = res["results"]["ruler.vt_4096"]
    assert (r["name"], r["alias"], r["sample_len"], r["score,none"]) == ("ruler.vt_4096", "ruler.vt_4096", 4, 0.625)
    scores = [1, 0.5, 0, 1]
    sd = math.sqrt(sum((s - 0.625) ** 2 for s in scores) / 3)
    assert r["score_stderr,none"] == pytest.approx(sd / 2)
    assert res["n-samples"]["needle_1024"] == {"original": 3, "effective": 3}
    assert res["n-shot"] == {"needle_1024": 0, "ruler.vt_4096": 0}
    assert res["higher_is_better"]["ruler.vt_4096"] == {"score": True}
    assert res["configs"]["ruler.vt_4096"]["output_type"] == "generate_until"
    assert res["versions"]["ruler.vt_4096"] == "v1"
    args = res["config"]["model_args"]
    assert (args["pretrained"], args["kv_policy"], args["budget"], args["chunk_size"]) == ("m", "keydiff", "25%", 0)
    assert (res["model_name"], res["model_name_sanitized"], res["date"]) == (name, name, date.timestamp())
    lines = (out / name / files[2]).read_text().splitlines()
    assert len(lines) == 4
    s = json.loads(lines[1])
    assert list(s) == ["doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
                       "doc_hash", "prompt_hash", "target_hash", "score"]
    assert (s["doc_id"], s["doc"]["id"], s["resps"], s["filtered_resps"], s["filter"], s["metrics"], s["score"]) == \
        (1, "s1", [[PRED[1]]], [PRED[1]], "none", ["score"], 0.5)
    assert s["target"] == str(REFS[1]) and s["target_hash"] == hashlib.sha256(s["target"].encode()).hexdigest()
    assert s["prompt_hash"] == "h1" and s["arguments"]["gen_args_0"]["arg_1"]["do_sample"] is False


@pytest.fixture
def cli():
    return cli_app(export_cmds.register)


@pytest.mark.parametrize("fmt,out_name,message", [
    ("kvpress", "busy", "error: --out: {tmp}/busy exists and is not an empty directory; expected a new directory"),
    ("lm-eval", "nodir/x", "error: --out: directory {tmp}/nodir does not exist"),
    ("xml", "x", "error: --format: expected one of parquet, csv, jsonl, kvpress, lm-eval, got 'xml'"),
])
def test_bad_export_exits_2_writing_nothing(run, cli, fmt, out_name, message):
    _, tmp = run
    (tmp / "busy").mkdir()
    (tmp / "busy" / "keep.txt").write_text("x")
    before = sorted(str(p) for p in tmp.rglob("*"))
    r = runner.invoke(cli, ["export", "r1", "--format", fmt, "--out", str(tmp / out_name), "--db",
                            str(tmp / "index.sqlite")], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and r.output.strip() == message.format(tmp=tmp)
    assert sorted(str(p) for p in tmp.rglob("*")) == before


@pytest.mark.parametrize("writable", [False, True])
def test_an_empty_mount_point_as_out(run, cli, writable):
    """An empty mount point: read-only, one line saying so (not "Device or resource busy"), exit 2; writable,
    the tree is written into it."""
    from tests.support.helpers import tmpfs

    _, tmp = run
    mnt = tmp / "mnt"
    mnt.mkdir()
    with tmpfs(mnt, "1m" if writable else "64k,ro"):
        r = runner.invoke(cli, ["export", "r1", "--format", "kvpress", "--out", str(mnt), "--db",
                                str(tmp / "index.sqlite")], env={"COLUMNS": "300"})
        if writable:
            assert r.exit_code == 0, r.output
            assert len([d for d in mnt.iterdir() if d.is_dir()]) == 5 and not list(mnt.glob(".*"))
        else:
            assert r.exit_code == 2 and r.output.strip() == f"error: --out: {mnt} is on a read-only file system"
            assert list(mnt.iterdir()) == []


def test_cli_writes_the_kvpress_tree(run, cli):
    _, tmp = run
    r = runner.invoke(cli, ["export", "r1", "--format", "kvpress", "--out", str(tmp / "kv"), "--db",
                            str(tmp / "index.sqlite")], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"run r1: 5 cells -> {tmp / 'kv'} (5 kvpress result directories)"


def test_one_driver_reads_each_cell_once_for_every_directory_format(run, monkeypatch):
    idx, tmp = run
    assert tuple(FILES) == DIR_FORMATS
    reads = []
    real = export_job.read_verified_cell  # reads and checks a cell's files, each once
    monkeypatch.setattr(export_job, "read_verified_cell",
                        lambda view, *a: reads.append(view.id) or real(view, *a))
    for fmt in DIR_FORMATS:
        reads.clear()
        done, _, _ = export_dir(idx, "r1", fmt, tmp / fmt)
        assert len(done.cells) == 5 and len(reads) == 5 and len(set(reads)) == 5
    with pytest.raises(ValueError, match=r"^--format: expected one of kvpress, lm-eval, got 'csv'$"):
        export_dir(idx, "r1", "csv", tmp / "x")
    assert not (tmp / "x").exists()
