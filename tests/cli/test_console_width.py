"""The CLI's consoles follow the terminal's width (COLUMNS) of each call, not the width of the moment their module
was first imported: a long-lived process (or a test run) calling the commands at several widths gets each."""
from __future__ import annotations

import importlib
import sys

from typer.testing import CliRunner

import kdeval.cli
from tests.support.helpers import cli_app

MODULE = "kdeval.cli.generate_cmds"
NOTE = "Every policy runs under two protocols"  # the first line after the table: soft-wrapped prose, one line


def _table_width(app) -> int:
    """The widest line of the table `kdeval policies` prints (the notes after it are single unwrapped lines)."""
    res = CliRunner().invoke(app, ["policies"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith(NOTE))
    return max(len(line) for line in lines[:end])


def test_a_table_follows_the_width_of_each_call_not_the_width_at_import(monkeypatch):
    """`kdeval policies` from its module imported afresh while COLUMNS is 200, then run at 60 and at 200."""
    monkeypatch.setattr(kdeval.cli, "generate_cmds", importlib.import_module(MODULE))  # both put back after the
    monkeypatch.delitem(sys.modules, MODULE)  # test: the other tests keep the module they imported
    monkeypatch.setenv("COLUMNS", "200")
    app = cli_app(importlib.import_module(MODULE).register)

    monkeypatch.setenv("COLUMNS", "60")
    assert _table_width(app) <= 60
    monkeypatch.setenv("COLUMNS", "200")
    assert 60 < _table_width(app) <= 200
