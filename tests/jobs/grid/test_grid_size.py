"""Grid bombs are refused in seconds, naming the size and the limit: a YAML alias bomb (nine levels of ten
aliases: 10⁹ values from a few hundred bytes), an alias that contains itself, and a grid of millions of cells
(3 policies × 1,000 budgets × 1,000 lengths), before any cell or task instance is built."""
from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.jobs.grid import size
from kdeval.jobs.grid.load import parse_grid

runner = CliRunner()
BASE = ("models: ['random:llama-tiny']\npolicies: [full, keydiff, sink]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{name: needle, lengths: [512], samples: 2}]\n")


def _alias_bomb(levels: int) -> str:
    """Anchors a..: each a list of ten aliases of the one before."""
    names = "abcdefghijklmnop"
    lines = ["x-a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, cur in zip(names, names[1:levels]):
        lines.append(f"x-{cur}: &{cur} [{', '.join(['*' + prev] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["name", "budgets"])
def test_an_alias_bomb_is_refused_in_seconds(tmp_path, where):
    last = "abcdefghi"[8]
    text = _alias_bomb(9) + BASE.replace("budgets: [64]", f"budgets: *{last}" if where == "budgets" else
                                         "budgets: [64]") + (f"name: *{last}\n" if where == "name" else "")
    grid = tmp_path / "g.yaml"
    grid.write_text(text)
    t0 = time.monotonic()
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")],
                      env={"COLUMNS": "300"})
    took = time.monotonic() - t0
    assert r.exit_code == 2, r.output
    assert took < 10, took
    assert (f"the grid expands to more than {size.MAX_GRID_VALUES} values once its YAML aliases are followed"
            in r.output), r.output
    assert len(r.output.strip().splitlines()) == 2, r.output  # the header and the one problem


def test_an_alias_that_contains_itself_is_refused():
    with pytest.raises(Exception) as e:
        parse_grid("name: &n [a, *n]\n" + BASE.replace("name", "x"))
    assert "a YAML alias refers to a node that contains it" in str(e.value)


def test_values_are_counted_with_aliases_followed_and_shared_nodes_measured_once():
    leaf = [1, 2, 3]  # 4 values
    assert size.expanded_values({"a": leaf, "b": [leaf, leaf]}) == 1 + 4 + (1 + 4 + 4)
    assert size.expanded_values({"a": [1] * 50}, limit=10) <= 12  # counting stops just past the limit


def test_millions_of_cells_are_refused_before_any_is_built(tmp_path, monkeypatch):
    from kdeval.jobs.grid import cells

    built = []
    monkeypatch.setattr(cells, "build_eval_task", lambda *a, **k: built.append(a))
    lengths = ", ".join(str(256 + i) for i in range(1000))
    budgets = ", ".join(str(16 + i) for i in range(1000))
    grid = tmp_path / "g.yaml"
    grid.write_text(BASE.replace("budgets: [64]", f"budgets: [{budgets}]").replace("lengths: [512]",
                                                                                  f"lengths: [{lengths}]"))
    t0 = time.monotonic()
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert time.monotonic() - t0 < 10
    n = 1000 * (1 + 2 * 1000)  # full once per length, keydiff and sink once per budget and length
    assert f"the grid expands to {n} cells" in r.output and f"at most {size.MAX_GRID_CELLS} are accepted" in r.output
    assert built == []


def test_the_cell_count_is_what_expansion_enumerates():
    from kdeval.jobs.grid.cells import expand_grid

    grid = parse_grid(BASE.replace("budgets: [64]", "budgets: [64, 128]").replace("lengths: [512]",
                                                                                 "lengths: [512, 1024]")
                      + "kv_quant: [none, {bits: 4, group_size: 16}]\nprotocol: [{compress: prompt}, "
                        "{compress: context}]\n")
    assert size.cell_count(grid) == len(expand_grid(grid, version="v").cells) == 2 * 2 * (1 + 2 * 2 * 2)
