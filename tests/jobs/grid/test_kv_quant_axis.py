"""The ``kv_quant`` grid axis: one cell per entry for every policy (the full cache too), ``none`` keeping exactly
the ids of a grid without the axis, the setting reaching the engine, and a bad entry one line naming its path."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as cli
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid

from .test_thinking_identity import GRID, IDS_BEFORE, VERSION


def _cells(extra: str = ""):
    return expand(parse_grid(GRID + extra), version=VERSION)


def test_none_keeps_the_ids_and_each_setting_is_a_cell_of_its_own(data_dir):
    assert sorted(c.id for c in _cells("kv_quant: [none]\n")) == IDS_BEFORE
    cells = _cells("kv_quant: [none, 4, {bits: 2, group_size: 16, window: 64, scheme: per_token}]\n")
    assert len(cells) == 3 * len(IDS_BEFORE)
    plain = [c for c in cells if c.kv_quant is None]
    assert sorted(c.id for c in plain) == IDS_BEFORE
    four = {(c.policy, c.task.name): c for c in cells if c.kv_quant is not None and c.kv_quant.bits == 4}
    assert set(four) == {(c.policy, c.task.name) for c in plain}  # the full cache in 4 bits too
    cell = four[("keydiff", "needle")]  # random:llama-tiny's head_dim 16 does not take KIVI's 32: the group is 16
    assert cell.to_task().engine == {"kv_quant": {"bits": 4, "group_size": 16, "window": 128, "scheme": "kivi"}}
    assert "kv_quant=kivi-4b-g16-w128" in cell.describe()
    two = [c for c in cells if c.kv_quant is not None and c.kv_quant.bits == 2]
    assert {c.kv_quant.label for c in two} == {"per_token-2b-g16-w64"}
    assert len({c.id for c in cells}) == len(cells)


@pytest.mark.parametrize("entry, message", [
    ("[{bits: 3}]", "kv_quant[0].bits: expected one of [2, 4, 8], got 3"),
    ("[none, 16]", "kv_quant[1].bits: expected one of [2, 4, 8], got 16"),
    ("[{group_size: 0}]", "kv_quant[0].group_size: expected a positive number of elements per group, got 0"),
    ("[{window: -4}]", "kv_quant[0].window: expected a number of recent tokens >= 0, got -4"),
    ("[{scheme: kivy}]", "kv_quant[0].scheme: expected one of ['kivi', 'per_token'], got 'kivy'"),
    ("[4, {bits: 4}]", "kv_quant[1]: duplicate of an earlier entry (each setting once)"),
    ("[{bit: 4}]", "kv_quant[0].bit: unknown field"),
])
def test_a_bad_entry_names_its_path(entry, message):
    with pytest.raises(GridError) as e:
        parse_grid(GRID + f"kv_quant: {entry}\n")
    assert any(str(i).startswith(message) for i in e.value.issues), [str(i) for i in e.value.issues]


def test_the_cli_refuses_it_naming_the_field(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID + "kv_quant: [{bits: 3}]\n")
    res = CliRunner().invoke(cli, ["submit", str(grid), "--db", str(tmp_path / "i.sqlite"), "--results-dir",
                                   str(tmp_path / "results")], env={"COLUMNS": "300"})
    lines = [ln.strip() for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 2 and lines[0].endswith("1 problem"), res.output  # the grid's form
    assert lines[1] == "kv_quant[0].bits: expected one of [2, 4, 8], got 3"
    assert not (tmp_path / "results").exists() and not (tmp_path / "i.sqlite").exists()


def test_kdeval_policies_explains_the_axis():
    res = CliRunner().invoke(cli, ["policies"], env={"COLUMNS": "300"})
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "quantized KV store (grid `kv_quant:`" in text and "scores the step's incoming keys in full precision" in text


@pytest.mark.parametrize("WIDTH", [80, 66])
def test_status_keeps_the_default_store_tag_whole(paths, WIDTH):
    """A user's 80-column terminal, and one of 66 where the policy column is at its least: the default store's
    tag (``[kivi-4b-g16-w128]`` on random:llama-tiny, 18 characters) stays on one line, as ``[query-agnostic]``
    does (it folded as ``[kivi-4b-g32-w128`` / ``]``)."""
    import io

    from rich.console import Console

    from kdeval.cli.status_view import status_table
    from tests.support.helpers import new_run

    text = GRID.replace("  - {name: math500, samples: 3}\n", "").replace("lengths: [400]", "lengths: [512, 1024]")
    idx, run_id, _ = new_run(paths["db"], paths["results"], text + "kv_quant: [none, 4]\n")
    buf = io.StringIO()
    Console(file=buf, width=WIDTH, markup=False).print(status_table(idx, run_id, WIDTH))
    idx.close()
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH
    assert sum("[kivi-4b-g16-w128]" in ln for ln in lines) == 4, lines  # keydiff and full, quantized, 2 lengths
    assert not any("[kivi-4b-g16-w12" in ln and "[kivi-4b-g16-w128]" not in ln for ln in lines), lines
