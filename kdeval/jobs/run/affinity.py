"""Model affinity: which model's work an idle worker takes next, so that each model is loaded at most once per
worker, usually less (loading a model costs more than waiting for a worker that holds it)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sized

from kdeval.cluster.workload import WorkerInfo


@dataclass
class WorkerSlot:
    """One worker actor of a scheduler: its name, the actor, what it said when it started (None: not ready),
    the model it holds, and whether it is running something or gone."""

    name: str
    actor: Any
    info: WorkerInfo | None = None
    loaded_key: str | None = None
    busy: bool = False
    alive: bool = True
    loads: int = 0


def pick_model(queue: Mapping[str, Sized], worker: WorkerSlot, workers: Iterable[WorkerSlot]) -> str | None:
    """The model (key of ``queue``: model -> its cells not taken and shards not started) whose next item the idle
    ``worker`` takes: the model it holds, while it has work queued; else, among the models with more work queued
    than other ready, live workers holding them, the one held by the fewest (ties: the most work queued); else
    None (wait)."""
    if worker.loaded_key and queue.get(worker.loaded_key):
        return worker.loaded_key
    holders = Counter(w.loaded_key for w in workers if w.alive and w.info is not None and w is not worker)
    keys = [k for k, q in queue.items() if q and len(q) > holders[k]]
    if not keys:
        return None
    return min(keys, key=lambda k: (holders[k], -len(queue[k])))
