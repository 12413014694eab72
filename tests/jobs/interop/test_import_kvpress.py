"""``kdeval import kvpress DIR``: kvpress's predictions land in the index as an external run whose cells sit
where kdeval's cells of the same experiment sit; ``report --compare`` pairs by sample where the samples are
kvpress's set's and says how many paired; RULER reads kvpress's set as a task source; bad DIRs exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from kdeval.cli import import_cmds
from kdeval.jobs.interop.kvpress_import import import_kvpress, parse_answer
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run
from tests.support.helpers import cli_app

runner = CliRunner()
KEEP = {"compress": "context", "decode": "keep"}


def kvpress_dir(root: Path, press="snapkv", ratio=0.75, query_aware=False) -> Path:
    """A result directory as kvpress's evaluate.py writes it (its DataFrame less ``context``, to_csv)."""
    d = root / f"ruler__4096__org--model__{press}__{ratio:.2f}"
    d.mkdir(parents=True)
    df = pd.DataFrame({
        "question": ["q"] * 6, "answer_prefix": ["A:"] * 6,
        "answer": [np.array(["123", "456"]), np.array(["123"]), np.array(["9"]), np.array(["7"]), np.array(["8"]),
                   np.array(["x"])],
        "task": ["vt", "vt", "vt", "vt", "cwe", "cwe"], "max_new_tokens": [30] * 6,
        "predicted_answer": ["123 and 456", "nope", "9", "7", "8", "y"], "compression_ratio": [ratio] * 6})
    df.to_csv(d / "predictions.csv", index=False)
    (d / "metrics.json").write_text(json.dumps({"vt": {"string_match": 62.5}, "cwe": {"string_match": 50.0}}))
    (d / "config.yaml").write_text(yaml.safe_dump({"dataset": "ruler", "data_dir": "4096", "model": "org/model",
                                                   "press_name": press, "compression_ratio": ratio,
                                                   "query_aware": query_aware, "fraction": 1.0}))
    return d


def test_answers_parse_from_each_way_kvpress_writes_them():
    assert parse_answer("['123' '456']") == ["123", "456"] == parse_answer("['123', '456']")
    assert parse_answer("plain") == ["plain"] and parse_answer(["a", 1]) == ["a", "1"]


def test_import_records_an_external_run_that_pairs_by_sample(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    kvpress_dir(tmp_path / "kv")
    run_id, cells = import_kvpress(idx, tmp_path / "kv", tmp_path / "results", model="m")
    assert run_id.startswith("kvpress-") and len(cells) == 2
    run = idx.get_run(run_id)
    assert run.state == "done" and yaml.safe_load(run.grid_yaml)["external"]["computed_by"].startswith("kvpress")
    views = {v.task: v for v in idx.run_cells(run_id)}
    vt = views["ruler.vt@4096#s0"]
    assert (vt.policy, vt.grid_budget, vt.chunk_size, vt.spec["protocol"], vt.spec["external"]["source"]) == \
        ("snapkv", "25%", 0, KEEP, str(tmp_path / "kv" / "ruler__4096__org--model__snapkv__0.75"))
    assert vt.provenance["computed_by"].startswith("kvpress") and vt.summary["kvpress_metrics"] == {"string_match": 62.5}
    got = idx.read_cell_rows(vt.id)
    assert [r["id"] for r in got] == [f"kvpress/ruler.vt/L4096/{i}" for i in range(4)]
    assert [r["score"] for r in got] == [1.0, 0.0, 1.0, 1.0] and got[0]["references"] == ["123", "456"]
    assert {r["compression_ratio"] for r in got} == {0.75} and got[0]["protocol"] == "context/keep"

    # a kdeval run of the same experiment: vt on kvpress's set (3 of its 4 samples), cwe on generated samples
    vt_rows = rows([1, 1, 0], task="ruler.vt", length=4096, ids=[f"kvpress/ruler.vt/L4096/{i}" for i in range(3)])
    store_run(idx, tmp_path / "results", "mine", [
        FakeCell("snapkv", "25%", task="ruler.vt", length=4096, chunk=0, protocol=KEEP, rows=vt_rows),
        FakeCell("snapkv", "25%", task="ruler.cwe", length=4096, chunk=0, protocol=KEEP,
                 rows=rows([1, 1], task="ruler.cwe", length=4096, prefix="ruler.cwe/L4096/")),
    ])
    rep = build_report(idx, ["mine"], ReportOptions(compare=run_id, resamples=50))
    by = {r.metric: r for r in rep.scores if r.level == "task"}
    assert (by["ruler.vt"].n_paired, by["ruler.vt"].n_dropped, by["ruler.vt"].delta) == (3, 1, 0.0)
    assert by["ruler.cwe"].n_paired == 0 and by["ruler.cwe"].ref_value == 50.0
    assert (f"run {run_id} is external, computed by kvpress evaluation/evaluate.py: 1 of 2 task scores paired by "
            f"sample id (3 samples); the others compare aggregates only (their samples differ)") in rep.meta.notes
    alone = build_report(idx, [run_id], ReportOptions(resamples=20))  # the imported run reports like any run
    assert {r.metric: r.value for r in alone.scores if r.level == "task"} == {"ruler.vt": 75.0, "ruler.cwe": 50.0}
    with pytest.raises(ValueError, match="is already imported as run kvpress-"):
        import_kvpress(idx, tmp_path / "kv", tmp_path / "results", model="m")
    idx.close()


def test_longbench_rows_keep_longbench_ids(tmp_path):
    """kvpress's LongBench set is LongBench's rows: an imported row pairs with kdeval's sample of that ``_id``."""
    d = tmp_path / "kv" / "longbench__qasper__org--model__tova__0.50__query_aware"
    d.mkdir(parents=True)
    pd.DataFrame({"question": ["q1", "q2"], "answers": [np.array(["yes"]), np.array(["unanswerable"])],
                  "_id": ["abc", "def"], "all_classes": [None, None], "task": ["qasper", "qasper"],
                  "predicted_answer": ["yes", "no"]}).to_csv(d / "predictions.csv", index=False)
    (d / "metrics.json").write_text("{}")
    (d / "config.yaml").write_text(yaml.safe_dump({"dataset": "longbench", "data_dir": "qasper", "model": "m",
                                                   "press_name": "tova", "compression_ratio": 0.5,
                                                   "query_aware": True}))
    idx = RunIndex.open(tmp_path / "index.sqlite")
    run_id, [cell] = import_kvpress(idx, tmp_path / "kv", tmp_path / "results")
    assert (cell.spec["task"]["name"], cell.spec["budget"], cell.spec["protocol"]["compress"]) == \
        ("longbench.qasper", "50%", "prompt")
    assert [(r["id"], r["score"]) for r in cell.rows] == [("longbench.qasper/abc", 1.0), ("longbench.qasper/def", 0.0)]
    idx.close()


@pytest.fixture
def cli():
    return cli_app(import_cmds.register)


@pytest.mark.parametrize("case", ["missing", "empty", "bad-config", "latin-1-config", "linked-out", "escapes",
                                  "bidi", "rows", "rows-over-dirs", "bytes"])
def test_bad_import_dir_exits_2_writing_nothing(tmp_path, cli, case, monkeypatch):
    from kdeval.jobs.interop import kvpress_import
    from kdeval.shown import shown  # the directory's name holds the press name: printed escaped too

    target = tmp_path / "kv"
    if case != "missing":
        target.mkdir()
    named = "error: DIR: "
    if case in ("bad-config", "latin-1-config", "linked-out"):
        d = kvpress_dir(tmp_path / "kv")
        (d / "config.yaml").write_text("just: text\n") if case == "bad-config" else None
    if case == "latin-1-config":  # a config saved in Latin-1: the error names the file
        (d / "config.yaml").write_bytes((d / "config.yaml").read_bytes() + "# Écrit par Hélène\n".encode("latin-1"))
        named = f"error: DIR: {d / 'config.yaml'} is not UTF-8 text (byte 0xc9 at offset "
    if case == "linked-out":  # predictions.csv a link to a file outside DIR: refused, not read
        outside = tmp_path / "elsewhere.csv"
        (d / "predictions.csv").rename(outside)
        (d / "predictions.csv").symlink_to(outside)
        named = (f"error: DIR: {d / 'predictions.csv'} resolves to {outside}, outside {target}: refusing to import "
                 "a file from outside DIR")
    if case in ("escapes", "bidi"):  # a press name that would drive the terminal, or reorder what it prints
        press, found = ("snap\x1b[2J\x1b]0;pwned\x07kv", r"\x1b") if case == "escapes" else ("snap\u202ekv", r"\u202e")
        d = kvpress_dir(tmp_path / "kv", press=press)
        named = (f"error: DIR: {shown(d / 'config.yaml')}: press_name must not contain control, bidi or invisible "
                 f"characters (found '{found}')")
    if case in ("rows", "rows-over-dirs"):  # more predictions than an import takes (a grid's cap, made small here)
        monkeypatch.setattr(kvpress_import, "MAX_IMPORT_ROWS", 8)
        d = kvpress_dir(tmp_path / "kv")
        _many_rows(d, 9 if case == "rows" else 5)
        if case == "rows-over-dirs":
            _many_rows(kvpress_dir(tmp_path / "kv", press="tova"), 5)
        room = 8 if case == "rows" else 3
        named = "error: DIR: "
        tail = f"holds more than {room} rows; an import takes at most 8 predictions"
    if case == "bytes":
        monkeypatch.setattr(kvpress_import, "MAX_PREDICTIONS_BYTES", 100)
        d = kvpress_dir(tmp_path / "kv")
        size = (d / "predictions.csv").stat().st_size
        named = f"error: DIR: {d / 'predictions.csv'} is {size} bytes; at most 100 bytes (0 MiB) are imported"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = runner.invoke(cli, ["import", "kvpress", str(target), "--db", str(tmp_path / "index.sqlite"),
                            "--results-dir", str(tmp_path / "results")], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith(named), r.output
    if case.startswith("rows"):
        assert tail in r.output, r.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def _many_rows(d: Path, n: int) -> None:
    """Make the result directory ``d`` hold ``n`` predictions (one task)."""
    df = pd.read_csv(d / "predictions.csv", keep_default_na=False)
    big = pd.concat([df[df.task == "vt"]] * (n // 4 + 1)).head(n)
    big.assign(predicted_answer=[f"answer {i} " + "x" * 40 for i in range(n)]).to_csv(d / "predictions.csv",
                                                                                      index=False)


def test_an_import_onto_a_full_results_dir_writes_nothing_and_can_be_run_again(tmp_path, cli):
    """A 64 KiB results directory and 3,000 rows: one line, exit 1, no run in the index and no file left; the
    same import with room succeeds (not "already imported")."""
    from tests.support.helpers import tmpfs

    _many_rows(kvpress_dir(tmp_path / "kv"), 3000)
    small = tmp_path / "small"
    small.mkdir()
    db = tmp_path / "index.sqlite"
    with tmpfs(small, "64k"):
        r = runner.invoke(cli, ["import", "kvpress", str(tmp_path / "kv"), "--db", str(db), "--results-dir",
                                str(small)], env={"COLUMNS": "300"})
        assert r.exit_code == 1, r.output
        assert r.output.strip() == (f"error: nothing imported: --results-dir {small}: No space left on device; the "
                                    "import can be run again"), r.output
        assert [p for p in small.rglob("*") if p.is_file()] == []
    assert RunIndex.open(db).list_runs() == []
    r = runner.invoke(cli, ["import", "kvpress", str(tmp_path / "kv"), "--db", str(db), "--results-dir",
                            str(tmp_path / "results")], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    [run] = RunIndex.open(db).list_runs()
    assert run.state == "done" and run.counts == {"done": 1}


def test_an_imported_run_is_rebuilt_from_the_results_directory(tmp_path, cli):
    from kdeval.cli.app import app as kdeval_app

    kvpress_dir(tmp_path / "kv")
    db, results = tmp_path / "index.sqlite", tmp_path / "results"
    r = runner.invoke(cli, ["import", "kvpress", str(tmp_path / "kv"), "--db", str(db), "--results-dir",
                            str(results)])
    assert r.exit_code == 0, r.output
    idx = RunIndex.open(db)
    [before] = idx.list_runs()
    cells = {c.id: (c.state, c.n_rows, c.summary, c.provenance) for c in idx.run_cells(before.id)}
    idx.close()
    for p in db.parent.glob(db.name + "*"):
        p.unlink()
    r = runner.invoke(kdeval_app, ["index", "rebuild", "--results-dir", str(results), "--db", str(db)],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.output.startswith("rebuilt 1 run(s) with 2 done cell(s)"), r.output
    idx = RunIndex.open(db)
    run = idx.get_run(before.id)
    assert (run.name, run.state, run.counts) == (before.name, "done", {"done": 2})
    assert {c.id: (c.state, c.n_rows, c.summary, c.provenance) for c in idx.run_cells(run.id)} == cells


def test_cli_imports(tmp_path, cli):
    kvpress_dir(tmp_path / "kv")
    r = runner.invoke(cli, ["import", "kvpress", str(tmp_path / "kv"), "--model", "m", "--db",
                            str(tmp_path / "index.sqlite"), "--results-dir", str(tmp_path / "results")],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.output.startswith("run kvpress-") and "2 cells, 6 predictions imported from kvpress (external)" in r.output


def _bomb(d: Path) -> str:
    """A YAML alias bomb: nine levels of nine aliases, 9⁹ values once walked, in a few hundred bytes."""
    lines = ['a0: &a0 ["lol"]'] + [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 10)]
    (d / "config.yaml").write_text("\n".join(lines) + "\ndataset: ruler\nmodel: *a9\npress_name: snapkv\n")
    return f"{d / 'config.yaml'} is not readable YAML: line 2, column 10: aliases (*name) are not accepted"


def _deep_yaml(d: Path) -> str:
    (d / "config.yaml").write_text("dataset: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return f"{d / 'config.yaml'} is not readable YAML: line 1, column 73: nested deeper than 64 levels"


def _deep_metrics(d: Path) -> str:
    (d / "metrics.json").write_text('{"vt": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return f"{d / 'metrics.json'} is nested deeper than 64 levels"


def _nan_ratio(d: Path) -> str:
    text = (d / "config.yaml").read_text().replace("compression_ratio: 0.75", "compression_ratio: .nan")
    (d / "config.yaml").write_text(text)
    return (f"{d / 'config.yaml'}: compression_ratio: expected a finite number from 0 up to (not "
            "including) 1, got nan")


def _nan_metric(d: Path) -> str:
    (d / "metrics.json").write_text('{"vt": {"string_match": NaN}, "cwe": {"string_match": 50.0}}')
    return f"{d / 'metrics.json'}: vt.string_match: expected a finite number, got nan"


def _nan_row(d: Path) -> str:
    df = pd.read_csv(d / "predictions.csv", keep_default_na=False)
    df["compression_ratio"] = df["compression_ratio"].astype(str)
    df.loc[4, "compression_ratio"] = "nan"
    df.to_csv(d / "predictions.csv", index=False)
    return (f"{d / 'predictions.csv'}: row 5: compression_ratio: expected a finite number from 0 up to (not "
            "including) 1, got 'nan'")


def _fifo_config(d: Path) -> str:
    import os

    (d / "config.yaml").unlink()
    os.mkfifo(d / "config.yaml")
    return f"{d / 'config.yaml'} is a FIFO; expected a regular file"


def _fifo_predictions(d: Path) -> str:
    import os

    (d / "predictions.csv").unlink()
    os.mkfifo(d / "predictions.csv")
    return f"{d / 'predictions.csv'} is a FIFO; expected a regular file"


@pytest.mark.parametrize("make", [_bomb, _deep_yaml, _deep_metrics, _nan_ratio, _nan_metric, _nan_row,
                                  _fifo_config, _fifo_predictions], ids=lambda f: f.__name__.strip("_"))
def test_a_hostile_kvpress_dir_is_one_line_naming_file_and_field(tmp_path, cli, make):
    import time

    d = kvpress_dir(tmp_path / "kv")
    line = f"error: DIR: {make(d)}"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    start = time.perf_counter()
    r = runner.invoke(cli, ["import", "kvpress", str(tmp_path / "kv"), "--db", str(tmp_path / "index.sqlite"),
                            "--results-dir", str(tmp_path / "results")], env={"COLUMNS": "300"})
    assert time.perf_counter() - start < 5
    assert r.exit_code == 2, r.output
    assert r.output.strip() == line, r.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
