"""The shared-step stores a run is given: ``run_task(shared=...)`` maps each sample's id to the
:class:`~kdeval.keydiff.step.shared.SharedSteps` of its context, filled by the other cells of a group
(:func:`kdeval.evals.task_run.group_run.run_group`), at any batch size.

The engine replays or records a prompt's steps through the store of an ``Engine.sharing`` block; :func:`sharing`
is where the run side opens it, for the engine calls of one sample's context.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

if TYPE_CHECKING:
    from kdeval.keydiff.step.shared import SharedSteps

#: sample id -> the store of its context
Stores = Mapping[str, "SharedSteps"]


@contextmanager
def sharing(eng: Any, stores: Stores | None, sample_id: str) -> Iterator["SharedSteps | None"]:
    """``eng`` with the store of sample ``sample_id``'s context (none without ``stores``) while the block runs."""
    with eng.sharing(stores[sample_id] if stores else None) as store:
        yield store
