"""The grouping rule without Ray: which cells share (:func:`share_key`), what :func:`take_group` hands a worker
(never cells of another model, task, length, seed or sample range), and the grid's ``execution`` option (no
cell id depends on it; a bad value is one error naming ``execution.share``, exit 2)."""
from __future__ import annotations

from collections import deque

import pytest
from typer.testing import CliRunner

from kdeval.jobs.grid.cells import expand, grid_hash
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run.groups import can_share, share_key, take_group, units_of_work
from kdeval.jobs.run.service import scheduler_config
from kdeval.jobs.run.shards import Shard, shard_ranges

MIXED = """
name: mixed
models: ["stub:0", "stub:1"]
policies: [full, keydiff, {name: sink, params: {n_sink_tokens: 4}}]
budgets: [64, 128]
chunk_sizes: [32, whole]
protocol: [{compress: prompt}, {compress: context}]
tasks:
  - {name: needle, lengths: [256, 512], samples: 5, seeds: [0, 1]}
  - {name: needle, lengths: [256], samples: 5, params: {depths: [10, 30, 50, 70, 90]}}
"""


def _cells(text: str = MIXED, extra: str = ""):
    return expand(parse_grid(text + extra), version="t")


def test_share_key_ignores_policy_budget_chunk_and_protocol_only():
    cells = _cells()
    by_key: dict[str, list] = {}
    for c in cells:
        by_key.setdefault(share_key(c), []).append(c)
    # 2 models x (2 lengths x 2 seeds + 1 other task instance) = 10 keys; each holds every policy/budget/chunk/protocol
    assert len(by_key) == 10
    for group in by_key.values():
        assert len({(c.model_key, c.task.name, c.task.length, c.task.seed, str(c.task.params)) for c in group}) == 1
        assert len(group) == 2 * (1 + 2 * 2 * 2)  # chunks x (full + 2 policies x 2 budgets x 2 protocols)
    assert units_of_work(cells, 32, share=True) == 10 and units_of_work(cells, 2, share=True) == 30
    assert units_of_work(cells, 32, share=False) == len(cells)


def _drain(cells, shard_size: int, alone=()):
    """Run the rule as the scheduler does: pop the next item, take it when it is a cell, gather its group."""
    queue = deque(cells)

    def take(cell):
        first, *rest = [Shard(cell, i, a, b) for i, (a, b) in enumerate(shard_ranges(cell.task.samples, shard_size))]
        for shard in reversed(rest):
            queue.appendleft(shard)
        return first

    groups = []
    while queue:
        item = queue.popleft()
        first = take(item) if not isinstance(item, Shard) else item
        groups.append(take_group(first, queue, take, queue.appendleft, alone))
    return groups


def test_take_group_never_mixes_models_tasks_lengths_seeds_or_sample_ranges():
    cells = _cells()
    groups = _drain(cells, shard_size=2)  # 5 samples: shards (0, 2), (2, 4), (4, 5)
    assert len(groups) == 10 * 3
    units = [(g.cell.id, g.index) for group in groups for g in group]
    assert sorted(units) == sorted((c.id, i) for c in cells for i in range(3))  # every shard once
    for group in groups:
        assert len({share_key(s.cell) for s in group}) == 1 and len({(s.start, s.stop) for s in group}) == 1
        assert len({s.cell.model_key for s in group}) == 1 and len(group) == 18
        assert all(can_share(group[0], s) for s in group)


def test_shards_marked_alone_are_not_grouped():
    every = _cells()
    cells = [c for c in every if share_key(c) == share_key(every[0])]
    assert len(cells) == 18
    alone = {(cells[0].id, 0), (cells[3].id, 0)}
    groups = _drain(cells, shard_size=5, alone=alone)
    sizes = sorted(len(g) for g in groups)
    assert sizes == [1, 1, 16]
    assert {(g[0].cell.id, g[0].index) for g in groups if len(g) == 1} == alone


def test_a_taken_cell_of_another_sample_range_goes_back_to_the_queue():
    a, b = _cells()[:2]
    first = Shard(a, 1, 2, 4)  # a shard of a cell taken earlier
    queue = deque([b])
    got = take_group(first, queue, lambda cell: Shard(cell, 0, 0, 2), queue.appendleft)
    assert got == [first] and list(queue) == [Shard(b, 0, 0, 2)]


def test_execution_changes_no_cell_id_and_reaches_the_scheduler():
    plain, shared, alone = (_cells(extra=x) for x in ("", "execution: {share: true}\n", "execution: {share: false}\n"))
    assert [c.id for c in plain] == [c.id for c in shared] == [c.id for c in alone]
    grids = [parse_grid(MIXED + x) for x in ("", "execution: {share: true}\n", "execution: {share: false}\n")]
    assert grid_hash(grids[0]) == grid_hash(grids[1]) != grid_hash(grids[2])  # a default grid keeps its hash
    assert [scheduler_config(g).share for g in grids] == [True, True, False]


@pytest.mark.parametrize("value,expected", [
    ("{share: maybe}", "execution.share: Input should be a valid boolean (got 'maybe')"),
    ("{share: 1}", "execution.share: Input should be a valid boolean (got 1)"),
    ("{shared: false}", "execution.shared: unknown field (did you mean 'share'?)"),
    ("false", "execution: Input should be a valid dictionary"),
])
def test_a_bad_execution_is_one_error_naming_the_field(value, expected):
    with pytest.raises(GridError) as err:
        parse_grid(MIXED + f"execution: {value}\n")
    assert len(err.value.issues) == 1 and str(err.value.issues[0]).startswith(expected), err.value.issues


def test_submit_with_a_bad_execution_exits_2(app, paths):
    grid = paths["tmp"] / "bad.yaml"
    grid.write_text(MIXED + "execution: {share: maybe}\n")
    r = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir",
                                 str(paths["results"])])
    assert r.exit_code == 2 and "execution.share" in r.output, r.output
    assert not paths["results"].exists()
