"""`kdeval leaderboard` as a user runs it: exit codes and one-line errors, the terminal table at 100 columns, the
files it writes, and where `kdeval report` says the leaderboard is."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "index.sqlite"
    idx = RunIndex.open(path)
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1.0] * 12)),
                                                 FakeCell("keydiff", 256, rows=rows([1.0] * 11 + [0.0]))])
    store_run(idx, tmp_path / "results", "r2", [FakeCell("sink", 256, rows=rows([0.0] * 12))])
    idx.close()
    return str(path)


def _run(args, **kw):
    return CliRunner().invoke(app, ["leaderboard", *args], env={"COLUMNS": "100"}, **kw)


def test_terminal_table_ranks_cells_of_both_runs(db):
    res = _run(["--db", db, "--resamples", "100"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("3 cell(s) from 2 run(s)")
    ranked = [ln.split()[:2] for ln in lines if ln[:1].isdigit() and ln.split()[1] in ("full", "keydiff", "sink")]
    assert ranked == [["1", "full"], ["2", "keydiff"], ["3", "sink"]]
    sink = next(ln for ln in lines if ln.startswith("3  sink"))
    # paired with r1's full cache although it ran in r2 (its code unrecorded: flagged §); the CI may wrap
    assert "-100.00" in sink and sink.rstrip().endswith("§") and "[-100.00, -100.00]" in res.output
    assert max(len(ln) for ln in lines if "│" not in ln and not ln.startswith(("every row", "note"))) <= 100


@pytest.mark.parametrize("args, code, words", [
    (["--model", "mx"], 2, "error: --model mx: unknown model (did you mean 'm'?)"),
    (["--task", "neddle"], 2, "did you mean 'needle'?"),
    (["--policy", "keydif"], 2, "did you mean 'keydiff'?"),
    (["--protocol", "contxt/keep"], 2, "did you mean 'context/keep'?"),
    (["--rank", "speed"], 2, "--rank speed: expected one of score, delta"),
    (["--format", "pdf"], 2, "--format: unknown format 'pdf'"),
    (["--task", "math500"], 1, "nothing found: no done cell in the index matches tasks math500"),
])
def test_bad_input_exits_2_and_nothing_found_exits_1(db, args, code, words):
    res = _run(["--db", db, *args])
    assert res.exit_code == code, res.output
    text = res.output.strip()
    assert words in text and len(text.splitlines()) == 1


def test_an_empty_index_is_bad_input(tmp_path):
    path = tmp_path / "empty.sqlite"
    RunIndex.open(path).close()
    res = _run(["--db", str(path)])
    assert res.exit_code == 2 and res.output.strip() == "error: the index has no runs; `kdeval submit grid.yaml` first"


def test_formats_to_stdout_and_to_files(db, tmp_path):
    res = _run(["--db", db, "--format", "json", "--rank", "delta"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert [r["policy"] for r in data["rows"]] == ["full", "keydiff", "sink"] and data["meta"]["order"] == "delta"
    res = _run(["--db", db, "--format", "csv"])
    assert res.output.splitlines()[0].startswith("rank,model,task,policy,budget,chunk,n,value")
    res = _run(["--db", db, "--format", "md,html,csv", "--out", str(tmp_path / "lb")])
    assert res.exit_code == 0
    assert {p.name for p in (tmp_path / "lb").iterdir()} == {"leaderboard.md", "leaderboard.html", "leaderboard.csv"}
    assert "**m — needle@1024#s0, B=64 (ranked by score)**" in (tmp_path / "lb" / "leaderboard.md").read_text()
    res = _run(["--db", db, "--format", "table,md"])
    assert res.exit_code == 2 and "--out DIR is needed" in res.output


def test_report_says_where_the_leaderboard_is(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # wide enough that the index's path is never folded inside itself (a pytest-xdist worker's temp path is longer)
    wide = {"COLUMNS": "300"}
    res = CliRunner().invoke(app, ["report", "r1", "--db", db, "--resamples", "0"], env=wide)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())  # the line wraps at the terminal's width
    assert flat.endswith(f"leaderboard (every run of the index): `kdeval leaderboard --db {db}`; with --format html it "
                    f"is written to .kdeval/leaderboard/leaderboard.html")
    assert _run(["--db", db, "--format", "html"]).exit_code == 0  # the default place
    res = CliRunner().invoke(app, ["report", "r1", "--db", db, "--resamples", "0"], env=wide)
    flat = " ".join(res.output.split())
    assert flat.endswith(f"leaderboard (every run of the index): .kdeval/leaderboard/leaderboard.html; "
                         f"`kdeval leaderboard --db {db} --format html` refreshes it")
    assert (tmp_path / ".kdeval" / "leaderboard" / "leaderboard.html").is_file()
