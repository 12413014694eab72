"""Names, model ids, errors and predictions are text wherever they are printed: rich markup in them (``[/]``,
``[bold]``) neither crashes nor styles the CLI, and HTML in them (``<img src=x onerror=...>``) is escaped in
the Markdown and HTML reports."""
from __future__ import annotations

import functools
import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()

CLOSE = "[/]x"
BOLD = "[bold]b"
IMG = "<img src=x onerror=alert(1)>"
HOSTILE = f"{CLOSE} {BOLD} {IMG}"


@pytest.fixture
def wide(monkeypatch):
    """The CLI consoles (made per call) 400 cells wide: whole names on one line, so the test can find them."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def hostile_index(tmp_path):
    """An index whose run name, model id, cell error and predictions are hostile text."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    res = tmp_path / "results"
    pred = lambda i: {"prediction": HOSTILE}  # noqa: E731
    store_run(idx, res, "r1", [
        FakeCell("full", None, model=HOSTILE, rows=rows([1, 1, 0, 1], extra=pred)),
        FakeCell("keydiff", 64, model=HOSTILE, rows=rows([1, 0, 0, 1], extra=pred)),
        FakeCell("keydiff", 128, model=HOSTILE, rows=None, error=f"OSError: {HOSTILE} is not a model [/"),
    ], name=HOSTILE)
    db = str(idx.engine.url)
    idx.close()
    return db


def _assert_literal(output: str) -> None:
    assert "MarkupError" not in output and "Traceback" not in output, output
    assert CLOSE in output and BOLD in output, output


def test_ls_and_status_print_names_and_errors_as_text(hostile_index, wide):
    ls = runner.invoke(kdeval_app, ["ls", "--db", hostile_index])
    assert ls.exit_code == 0, ls.output
    _assert_literal(ls.output)
    assert HOSTILE in ls.output
    every = runner.invoke(kdeval_app, ["status", "--db", hostile_index])
    assert every.exit_code == 0 and HOSTILE in every.output, every.output
    one = runner.invoke(kdeval_app, ["status", "r1", "--db", hostile_index])
    assert one.exit_code == 0, one.output
    _assert_literal(one.output)
    assert f"OSError: {HOSTILE} is not a model [/" in one.output  # the error line, whole and literal
    assert f"({HOSTILE}, {HOSTILE})" in one.output  # run name and its one model in the heading


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "json", "html"])
def test_report_in_every_format_prints_hostile_text_as_text(hostile_index, wide, tmp_path, fmt):
    args = ["report", "r1", "--db", hostile_index, "--resamples", "50", "--format", fmt]
    if fmt == "html":
        args += ["--out", str(tmp_path / "out")]
    r = runner.invoke(kdeval_app, args)
    assert r.exit_code == 1, r.output  # the failed cell makes the report incomplete, nothing else fails
    assert "Traceback" not in r.output and "MarkupError" not in r.output, r.output
    if fmt == "table":
        _assert_literal(r.output)
        assert HOSTILE in r.output
    elif fmt == "md":
        assert "<img" not in r.stdout
        assert "&lt;img src=x onerror=alert(1)&gt;" in r.stdout and f"{CLOSE} {BOLD}" in r.stdout
    elif fmt == "csv":
        assert HOSTILE in r.stdout
    elif fmt == "json":
        data = json.loads(r.stdout)
        assert {row["model"] for row in data["scores"]} == {HOSTILE}
    else:
        page = (tmp_path / "out" / "report.html").read_text()
        assert "<img src=x onerror" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


class HostileErrorStub(StubWorkload):
    """The stub workload whose ``keydiff`` cells fail with an error that echoes hostile text (as a hub error
    echoes a model id)."""

    def run(self, handle, task):
        if task.policy == "keydiff":
            raise OSError(f"{HOSTILE} is not a valid model id [/")
        return super().run(handle, task)


def test_submit_final_table_prints_hostile_name_and_error_as_text(local_ray, paths, wide, monkeypatch):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(f"name: {json.dumps(HOSTILE)}\nmodels: ['stub:0.01']\npolicies: [full, keydiff]\n"
                    "budgets: [64]\nchunk_sizes: [32]\ntasks: [{name: needle, lengths: [256], samples: 2}]\n"
                    "retries: {max_attempts: 1}\n")
    monkeypatch.setattr(service, "execute_run",
                        functools.partial(service.execute_run, workload=HostileErrorStub(), num_cpus=2))
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--db", str(paths["db"]),
                                   "--results-dir", str(paths["results"])])
    assert r.exit_code == 1, r.output  # the keydiff cell failed
    _assert_literal(r.output)
    assert f"{HOSTILE} is not a valid model id [/" in r.output and f"({HOSTILE}, stub:0.01)" in r.output


FORMULAS = ["=HYPERLINK(\"http://x\",\"y\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def test_csv_exports_do_not_hand_spreadsheets_formulas(tmp_path):
    """A prediction or model id that opens as a formula is written with a leading ``'`` (OWASP's advice), in
    ``export --format csv`` and ``report --format csv``; numbers written as text (``-3``) are left alone."""
    import csv
    import io

    idx = RunIndex.open(tmp_path / "index.sqlite")
    texts = FORMULAS + ["-3", "plain"]
    pred = lambda i: {"prediction": texts[i]}  # noqa: E731
    store_run(idx, tmp_path / "results", "r1", [
        FakeCell("full", None, model="=cmd|' /C calc'!A0", rows=rows([1] * len(texts), extra=pred))])
    db = str(idx.engine.url)
    idx.close()
    out = tmp_path / "all.csv"
    r = runner.invoke(kdeval_app, ["export", "r1", "--format", "csv", "--out", str(out), "--db", db])
    assert r.exit_code == 0, r.output
    with open(out, newline="", encoding="utf-8") as fh:
        got = list(csv.DictReader(fh))
    assert [row["prediction"] for row in got] == ["'" + t for t in FORMULAS] + ["-3", "plain"]
    rep = runner.invoke(kdeval_app, ["report", "r1", "--db", db, "--resamples", "20", "--format", "csv"])
    cells = [c for row in csv.reader(io.StringIO(rep.stdout)) for c in row]
    assert "'=cmd|' /C calc'!A0" in cells and "=cmd|' /C calc'!A0" not in cells, rep.stdout


MATH = r"$\frac{1}{$"  # mathtext that does not parse: matplotlib raised on it and no page was written


@pytest.mark.parametrize("command", ["report", "leaderboard"])
def test_a_formula_in_a_name_is_drawn_as_text_in_the_html_figures(tmp_path, wide, command):
    """A model id and policy name holding ``$…$`` (a model path, an imported press name): the page is written
    with its figures, the name on it as given."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [
        FakeCell("full", None, model=MATH, rows=rows([1, 1, 0, 1])),
        FakeCell(f"kvpress:{MATH}", 64, model=MATH, rows=rows([1, 0, 0, 1])),
        FakeCell(f"kvpress:{MATH}", 128, model=MATH, rows=rows([1, 1, 0, 1]))], name=MATH)
    db = str(idx.engine.url)
    idx.close()
    out = tmp_path / "out"
    args = ["report", "r1"] if command == "report" else ["leaderboard"]
    args += ["--resamples", "20"]
    r = runner.invoke(kdeval_app, args + ["--db", db, "--format", "html", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "ParseException" not in r.output, r.output
    page = (out / f"{command}.html").read_text()
    assert MATH in page and page.count("data:image/png;base64,") >= 1
