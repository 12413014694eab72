"""What a user typed is shown, never obeyed: ESC sequences, BEL, bidi overrides and invisible characters in a grid
key, a run id, a run name or an imported press name reach the terminal as escapes (``\\x1b``, ``\\u202e``), in
every command that echoes them; a grid name holding bidi or invisible characters is refused at submit."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()
ENV = {"COLUMNS": "300"}
ESC = "\x1b[2J\x1b]0;pwned\x07"
HIDDEN = ("\x1b", "\x07", "\u202e", "\u2066", "\u2069", "\u200b")
BASE = ("models: ['random:llama-tiny']\npolicies: [full, keydiff]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{name: needle, lengths: [512], samples: 2}]\n")


def _raw_free(output: str) -> None:
    """No hidden character reached the output as itself."""
    assert not any(c in output for c in HIDDEN), repr(output)


@pytest.mark.parametrize("where", ["top", "policy", "task"])
def test_an_unknown_grid_key_is_echoed_escaped(tmp_path, where):
    key = f"budg{ESC}ets"
    text = {"top": BASE + f'"{key}": 1\n',
            "policy": BASE.replace("[full, keydiff]", f'[full, {{name: keydiff, params: {{"{key}": 1}}}}]'),
            "task": BASE.replace("samples: 2}", f'samples: 2, params: {{"{key}": 1}}}}')}[where]
    grid = tmp_path / "g.yaml"
    grid.write_text(text.replace("\x1b", "\\e").replace("\x07", "\\a"))  # YAML's escapes in double quotes
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")], env=ENV)
    assert r.exit_code == 2, r.output
    _raw_free(r.output)
    assert "budg\\x1b[2J\\x1b]0;pwned\\x07ets" in r.output, r.output


@pytest.fixture
def wide() -> dict[str, str]:
    """The environment that makes the CLI's consoles (made per call) 400 cells wide."""
    return {"COLUMNS": "400"}


@pytest.fixture
def index(tmp_path):
    """An index holding one run whose name carries escapes and bidi characters (as an older kdeval stored it)."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1, 0]))],
              name=f"n{ESC}\u202eevil\u2066x\u2069\u200b")
    db = str(idx.engine.url)
    idx.close()
    return db


@pytest.mark.parametrize("command", ["status", "resume", "cancel", "report"])
def test_an_unknown_run_id_is_echoed_escaped(index, command):
    r = runner.invoke(kdeval_app, [command, f"RUN{ESC}", "--db", index], env=ENV)
    assert r.exit_code == 2, r.output
    _raw_free(r.output)
    assert "RUN\\x1b[2J\\x1b]0;pwned\\x07" in r.output, r.output


def test_status_and_ls_show_a_stored_name_escaped(index, wide):
    for args in (["ls"], ["status"], ["status", "r1"]):
        r = runner.invoke(kdeval_app, [*args, "--db", index], env=wide)
        assert r.exit_code == 0, r.output
        _raw_free(r.output)
        assert "\\u202eevil\\u2066x\\u2069\\u200b" in r.output, r.output


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u2069", "\u200b"])
def test_a_grid_name_with_bidi_or_invisible_characters_is_refused(tmp_path, char):
    grid = tmp_path / "g.yaml"
    grid.write_text(f'name: "run{char}x"\n' + BASE)
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")], env=ENV)
    assert r.exit_code == 2, r.output
    _raw_free(r.output)
    assert f"name: must not contain bidi or invisible characters (found '\\u{ord(char):04x}')" in r.output, r.output
