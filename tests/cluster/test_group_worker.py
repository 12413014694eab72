"""The worker's group unit without Ray: ``CellWorker.run_group`` gives one outcome per cell (its own rows,
seconds and provenance), a group's error fails every cell of it as a group error, and the real workload's
run_task arguments of a cell (in a group a batch size the grid left unset is left to ``run_group``)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from kdeval.cluster.execute import run_settings
from kdeval.cluster.stub import StubWorkload
from kdeval.cluster.worker import CellWorker
from kdeval.cluster.workload import check_group
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
from tests.support.helpers import stub_grid


def _tasks(shard: tuple[int, int] = (0, 3)):
    cells = expand(parse_grid(stub_grid(cost=0)), version="t")
    return [dataclasses.replace(c.to_task(), sample_start=shard[0], sample_stop=shard[1]) for c in cells]


def test_run_group_gives_each_cell_its_own_outcome():
    tasks = _tasks((1, 3))
    worker = CellWorker(StubWorkload(), "w0")
    outs = worker.run_group(tasks)
    assert [o.cell_id for o in outs] == [t.cell_id for t in tasks] and all(o.ok for o in outs)
    assert worker.model_loads == 1
    for task, out in zip(tasks, outs):
        alone = StubWorkload().run(worker.handle, task).rows
        assert [r["id"] for r in out.rows] == ["needle/256/0/1", "needle/256/0/2"]
        assert out.rows == [dict(r, execution="shared") for r in alone]  # the rows it gets alone
        assert 0 <= out.duration_s < 1 and out.provenance and out.peak_memory_bytes == 1 << 20


def test_a_group_keeps_each_cell_outcome_as_it_finishes_for_the_driver_to_take_once():
    tasks = _tasks()
    worker = CellWorker(StubWorkload(), "w0")
    outs = worker.run_group(tasks)
    counts, news = worker.group_news()
    assert counts == [3] * len(tasks) and sorted(news) == list(range(len(tasks)))
    assert [news[k].rows for k in sorted(news)] == [o.rows for o in outs] and all(n.ok for n in news.values())
    assert worker.group_news() == (counts, {})  # each handed out once
    failing = CellWorker(StubWorkload(fail_policies=("keydiff-mean",)), "w0")
    failing.run_group(tasks)
    _, news = failing.group_news()
    assert [tasks[k].policy for k in sorted(news)] == ["full", "keydiff", "keydiff"]  # finished before the error


def test_an_error_raised_by_the_group_fails_every_cell_as_a_group_error():
    tasks = _tasks()
    outs = CellWorker(StubWorkload(fail_policies=("keydiff-mean",)), "w0").run_group(tasks)
    assert [(o.ok, o.group_error) for o in outs] == [(False, True)] * len(tasks)
    assert all("stub failure injected for policy 'keydiff-mean'" in o.error for o in outs)
    mixed = tasks[:1] + [dataclasses.replace(tasks[1], sample_start=1)]  # another sample range
    with pytest.raises(ValueError, match="cannot share"):
        check_group(mixed)
    outs = CellWorker(StubWorkload(), "w0").run_group(mixed)
    assert all(o.group_error and "cannot share" in o.error for o in outs)


class _NoModel(StubWorkload):
    """A workload whose model cannot load (as a model id that names nothing loadable)."""

    def load(self, task):
        raise ValueError("model: nothing loadable here")


def test_a_model_that_cannot_load_fails_every_member_as_its_own_error():
    """Not a group error: alone, each member would load the same model and fail again, so none runs alone next
    (the scheduler fails a cell on its own error without another attempt)."""
    tasks = _tasks()
    outs = CellWorker(_NoModel(), "w0").run_group(tasks)
    assert [(o.ok, o.group_error) for o in outs] == [(False, False)] * len(tasks)
    assert all("model: nothing loadable here" in o.error for o in outs)


def test_a_cell_in_a_group_leaves_an_unset_batch_size_to_run_group():
    import torch

    lm = SimpleNamespace(model=torch.nn.Linear(2, 2))  # on the CPU: the default batch is 8 for SDPA
    task = _tasks()[1]
    assert run_settings(lm, task, grouped=False).batch_size == 8
    assert run_settings(lm, task, grouped=True).batch_size is None
    four = dataclasses.replace(task, batch_size=4)
    assert [run_settings(lm, four, grouped=g).batch_size for g in (True, False)] == [4, 4]
    args = dataclasses.asdict(run_settings(lm, task, grouped=True))
    assert {k: args[k] for k in ("policy", "budget", "chunk_size", "compress", "decode")} == {
        "policy": task.policy, "budget": task.budget, "chunk_size": 32, "compress": "prompt", "decode": "evict"}
