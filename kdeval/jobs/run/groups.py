"""Groups: which queued work the scheduler hands a worker as one unit, so that cells compute what they share once.

Cells *can share* when they have one :func:`share_key`: the same loaded model (id, revision, dtype, attention
implementation) and the same task instance (name, length, seed, parameters, the samples it runs and the data
they come from) with the same generation length; policy, parameters, budget, chunk size, engine options,
protocol, thinking and batch size may differ. A *group* is the same sample shard ``[start, stop)`` of several
such cells: the worker runs it in one call (``CellWorker.run_group``), and each cell's rows are the rows it gets
alone, timings aside. Sharing is how a result is computed, not what it is: no cell id depends on it, and
``execution: {share: false}`` in a grid runs every cell alone.

:func:`take_group` is the rule: every queued cell of the picked shard's share key is taken (claimed and planned);
the group is then the shards of the consecutive sample ranges from the picked shard's on, up to the group's span,
of every cell of the key that has them all queued. The worker runs the span once for all of them and hands each
(cell, shard) over as soon as it is finished (streaming: the scheduler plans a group's cells in shards smaller than
its span for it). Shards marked to run alone (a retry after their group was lost or failed as a whole) are left
out.

Spreading: a group is as many units of work as its cells have shards, and the scheduler starts no more workers
than :func:`units_of_work`. When a run's groups are fewer units of work than its workers, :func:`spread_shard_sizes`
gives each share key a smaller shard size, the same for every cell of the key (so its cells still group), so that
the groups' shards spread over the workers: a one-task grid of 38 cells on 4 workers runs on all 4. The scheduler
uses it for fresh cells only; a cell with shards already stored keeps its recorded plan. Shards do not change
results (:mod:`kdeval.jobs.run.shards`).
"""
from __future__ import annotations

import json
from collections import deque
from typing import Callable, Collection, Mapping

from kdeval.jobs.grid.cells import CellSpec
from kdeval.jobs.run.shards import Shard, shard_ranges


def share_key(cell: CellSpec) -> str:
    """What the cells of one group have alike (see the module docstring); equal keys can share."""
    t = cell.task
    return json.dumps([cell.model_key, t.name, t.length, t.seed, t.samples, t.params, t.sample_ids_digest,
                       t.data_digest, t.data_source, cell.to_task().max_new_tokens], sort_keys=True, default=repr)


def can_share(a: Shard, b: Shard) -> bool:
    """Whether two shards may run in one group: cells of one share key, the same samples."""
    return (a.start, a.stop) == (b.start, b.stop) and share_key(a.cell) == share_key(b.cell)


def _unit(shard: Shard) -> tuple[str, int]:
    return shard.cell.id, shard.index


def take_group(first: Shard, queue: deque, take: Callable[[CellSpec], Shard | None],
               requeue: Callable[[Shard], None], alone: Collection[tuple[str, int]] = (),
               span: int | None = None) -> list[Shard]:
    """``first`` and the queued work that runs with it, removed from ``queue`` (one model's queue of cells not
    taken and shards of taken cells). Every queued cell of ``first``'s share key is taken with ``take`` (the
    scheduler's: claim the cell, plan its shards, queue all but the first, return the first or None; that one goes
    back through ``requeue``). The group is then the shards of a run of consecutive sample ranges starting at
    ``first``'s, at most ``span`` samples in all (None: ``first``'s range only), of every cell of the key that has
    all of them queued (fewer ranges when some cell has only the first ones): every cell on the same samples,
    ranges in order, cells in order within a range. ``alone``: (cell id, shard) of shards that run by themselves
    (``first`` among them: no group; the others are left out)."""
    if _unit(first) in alone:
        return [first]
    key = share_key(first.cell)
    fresh = [x for x in queue if isinstance(x, CellSpec) and share_key(x) == key]
    if fresh:
        taken = {id(x) for x in fresh}
        kept = [x for x in queue if id(x) not in taken]
        queue.clear()
        queue.extend(kept)
    for x in fresh:
        shard = take(x)
        if shard is not None:
            requeue(shard)
    queued: dict[str, dict[tuple[int, int], Shard]] = {first.cell.id: {(first.start, first.stop): first}}
    for x in queue:
        if isinstance(x, Shard) and share_key(x.cell) == key and _unit(x) not in alone:
            queued.setdefault(x.cell.id, {})[(x.start, x.stop)] = x
    ranges = [(first.start, first.stop)]
    mine = queued[first.cell.id]
    while span is not None and ranges[-1][1] < first.cell.task.samples:
        nxt = next((r for r in mine if r[0] == ranges[-1][1]), None)
        if nxt is None or nxt[1] - first.start > span:
            break
        ranges.append(nxt)
    cells = [cid for cid, have in queued.items() if ranges[0] in have]
    common = min(next((n for n, r in enumerate(ranges) if r not in queued[cid]), len(ranges)) for cid in cells)
    ranges = ranges[:common]
    group = [queued[cid][r] for r in ranges for cid in cells]
    chosen = {id(sh) for sh in group}
    kept = [x for x in queue if id(x) not in chosen]  # by identity: comparing cell specs costs
    queue.clear()
    queue.extend(kept)
    return [first] + [sh for sh in group if sh is not first]


def spread_shard_sizes(samples: Mapping[str, int], shard_size: int, workers: int) -> dict[str, int]:
    """The shard size of each group (``samples``: share key -> its cells' samples) that spreads the groups over
    ``workers``: ``shard_size`` for all when their shards at that size are already at least ``workers`` units of
    work; otherwise the spare workers are shared out one more shard at a time to the group with the most samples
    per shard (never more shards than samples), and a group given more shards has its samples over its shards as
    its size (at least 1, below ``shard_size``); the others keep ``shard_size``.

    1 group of 8 samples on 4 workers: 2 (4 shards of 2); 2 groups of 8 on 4 workers: 4 each (2 shards each)."""
    before = {k: len(shard_ranges(n, shard_size)) for k, n in samples.items()}
    shards = dict(before)
    for _ in range(workers - sum(shards.values())):
        more = [k for k, n in samples.items() if shards[k] < n]
        if not more:
            break
        k = max(more, key=lambda k: samples[k] / shards[k])
        shards[k] += 1
    return {k: shard_size if shards[k] == before[k] else min(shard_size, -(-n // shards[k]))
            for k, n in samples.items()}


def group_shard_sizes(cells: list[CellSpec], shard_size: int, workers: int) -> dict[str, int]:
    """:func:`spread_shard_sizes` of the groups of ``cells`` (share key -> shard size for its fresh cells)."""
    return spread_shard_sizes({share_key(c): c.task.samples for c in cells}, shard_size, workers)


def units_of_work(cells: list[CellSpec], shard_size: int, share: bool, workers: int = 1) -> int:
    """How many units of work (shards alone, or groups' shards) ``cells`` are at most, when fresh and run on
    ``workers`` (groups in the shard sizes of :func:`group_shard_sizes`): the scheduler starts no more workers
    than that."""
    if not share:
        return sum(len(shard_ranges(c.task.samples, shard_size)) for c in cells)
    groups = {share_key(c): c.task.samples for c in cells}
    sizes = spread_shard_sizes(groups, shard_size, workers)
    return sum(len(shard_ranges(n, sizes[k])) for k, n in groups.items())


def execution_label(summary: dict | None, n_rows: int | None) -> str:
    """``shared`` when some rows of a cell were computed in a group (its summary's ``shared_rows``; the others,
    timed alone, are usually its first sample), else "": what ``kdeval status`` adds to a done cell. ``n_rows``
    is not shown: at 80 columns the count folded the state over three lines."""
    return "shared" if (summary or {}).get("shared_rows") else ""
