"""``generation.thinking`` and cell identity: absent or ``keep`` leaves every id as before the field existed;
``strip`` is a different cell, and MATH-500 / AIME then generate their reasoning length."""
from __future__ import annotations

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid

GRID = """
name: ident
models: [random:llama-tiny]
policies: [full, keydiff]
budgets: [64]
chunk_sizes: [32]
tasks:
  - {name: needle, lengths: [400], samples: 2, params: {depths: [25, 75]}}
  - {name: math500, samples: 3}
"""
#: the ids of GRID's cells at this version, computed by the code before ``generation.thinking`` existed
IDS_BEFORE = ["039e5a16566ae672e9f0a807", "3f98f1ec1c6d730f9864fe97", "63d611246f3efe81792d9984",
              "95455afcc0b0040f1d1d3521"]
VERSION = "0.1.0+fixed"


def _cells(extra: str = ""):
    return expand(parse_grid(GRID + extra), version=VERSION)


def test_absent_or_keep_leaves_the_ids_unchanged(data_dir):
    assert sorted(c.id for c in _cells()) == IDS_BEFORE
    assert sorted(c.id for c in _cells("generation: {thinking: keep}\n")) == IDS_BEFORE


def test_strip_is_another_cell_and_sets_the_reasoning_length(data_dir):
    cells = _cells("generation: {thinking: strip}\n")
    assert not set(c.id for c in cells) & set(IDS_BEFORE) and len(cells) == 4
    by_task = {(c.policy, c.task.name): c for c in cells}
    math = by_task[("keydiff", "math500")]
    assert math.task.max_new_tokens == 32768 and math.to_task().max_new_tokens == 32768
    assert math.to_task().thinking == "strip" and "thinking=strip" in math.describe()
    needle = by_task[("keydiff", "needle")]
    kept = {(c.policy, c.task.name): c for c in _cells()}[("keydiff", "needle")]
    assert needle.to_task().max_new_tokens is None and needle.task.max_new_tokens == kept.task.max_new_tokens
    bounded = _cells("generation: {thinking: strip, max_new_tokens: 64}\n")
    assert {c.task.max_new_tokens for c in bounded} == {64}


def test_unknown_thinking_mode_is_refused():
    import pytest

    from kdeval.jobs.grid.errors import GridError

    with pytest.raises(GridError, match="generation.thinking"):
        parse_grid(GRID + "generation: {thinking: drop}\n")
