"""The shared steps of several prompts recorded in one batch: each prompt's trunk (its steps up to the bound of
its store, kdeval/keydiff/step/shared.py) is fed as rows of one forward per chunk instead of one batch-1 forward per
prompt and chunk, and each row's part of the forward is recorded in that prompt's store, under the key its
batch-1 step has. ``Engine.prefill_shared`` then replays those steps into every cell, the recording cell too.

Rows share positions: chunk ``k`` of every prompt is its tokens ``[kB, (k + 1)B)``, fed at those positions over a
cache that holds every token before them (nothing is evicted while recording), so a row computes what its prompt's
batch-1 step computes, up to the last bits a batch's shapes move (as a batch alone does,
tests/keydiff/test_batching.py). The batch feeds the full chunks every prompt records (the fewest of them); a
prompt's later steps are recorded at batch 1 by ``Engine.prefill_shared``, as before.

While it runs, the batch's cache holds every row's trunk beside the stores' copies: twice the trunk of each prompt
(at most the largest budget plus a chunk per layer and KV head).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from kdeval.keydiff.plan.capacity import planned
from kdeval.keydiff.loop.decoding import prompt_steps
from kdeval.keydiff.step.shared import SharedSteps, forward_signature, next_history, record_of
from kdeval.keydiff.loop.state import PrefillState

if TYPE_CHECKING:
    from kdeval.keydiff.plan.plan import Plan
    from kdeval.keydiff.step.step import Step


class RowRecording:
    """What a recording forward (``Step.forward``) stores into: batch row ``r`` recorded in ``stores[r]`` under
    ``keys[r]``. Every store serves the same member policies (one group's), so the first says what to capture."""

    def __init__(self, stores: Sequence[SharedSteps], keys: Sequence[str]):
        self.stores, self.keys = list(stores), list(keys)
        self.queries = self.stores[0].queries

    def recording_capture(self, plan: "Plan"):
        return self.stores[0].recording_capture(plan)

    def store(self, key: str | None, cache, logits: torch.Tensor, captures: dict, queries) -> None:
        for r, (store, row_key) in enumerate(zip(self.stores, self.keys)):
            store.keep(row_key, record_of(cache, logits, captures, queries, row=r))


def batch_signature(plan: "Plan") -> str | None:
    """The forward signature of this plan's steps when its recording forwards can run as rows of one batch: SDPA's
    output (captured rows beside it), a dynamic slot cache, no quantized store and no re-rotation (what the cache
    holds is then what was fed); else ``None``."""
    sig = forward_signature(plan)
    ok = sig is not None and sig.startswith("sdpa|") and plan.kv_quant is None and not plan.rerotate
    return sig if ok else None


def trunk_end(length: int, protect_last: int) -> int:
    """Where the shared steps of a prompt of ``length`` tokens end: before its last token and before its
    protected question (``protect_last`` tokens), which ``Engine.prefill_shared`` leaves to the batch it
    continues in. A prompt protected whole (``compress: generated``: nothing of it is evicted) shares every
    step but its last token's."""
    if protect_last == length:
        return length - 1
    return min(length - protect_last, length - 1)


def full_chunks(length: int, protect_last: int, chunk: int, bound: int | None) -> int:
    """How many full chunks of a prompt of ``length`` tokens ``Engine.prefill_shared`` feeds (:func:`trunk_end`) and
    a store of ``bound`` (``SharedSteps.bound``) records."""
    n = trunk_end(length, protect_last) // chunk
    return n if bound is None else min(n, bound // chunk)


@torch.inference_mode()
def record_trunks(step: "Step", prompts: Sequence[torch.Tensor], stores: Sequence[SharedSteps],
                  protect_last: Sequence[int]) -> int:
    """Record, in one batch, the full chunks that each of ``prompts`` (token ids ``[L_i]``, one per store) would
    record one at a time (module docstring); returns the chunks recorded per prompt (0: nothing done: fewer than two
    prompts to record, a plan that cannot batch them, or their first step already recorded)."""
    plan = step.plan
    sig, B = batch_signature(plan), plan.config.chunk_size
    if sig is None:
        return 0
    fresh = PrefillState.history  # what a new state's history is (a dataclass default)
    todo = [r for r, p in enumerate(prompts)
            if next_history(fresh, sig, 0, p[:B].unsqueeze(0)) not in stores[r].records]
    count = min((full_chunks(prompts[r].shape[0], protect_last[r], B, stores[r].bound(B)) for r in todo), default=0)
    if len(todo) < 2 or count == 0:
        return 0
    ids = torch.stack([prompts[r][: count * B] for r in todo])  # [rows, count * B]
    state = step.caches.new_state(len(todo), planned(plan, [[(B, False, False)] * count]))  # nothing evicted
    step.caches.make_room(state, count * B)  # the graph path's static cache: thawed to hold them
    histories = [fresh] * len(todo)
    for k, (chunk, _, _) in enumerate(prompt_steps(ids, B, 0)):
        s = k * B
        histories = [next_history(h, sig, s, chunk[i : i + 1]) for i, h in enumerate(histories)]
        positions = torch.arange(s, s + B, device=plan.device)
        step.device_step(state.cache, chunk, positions, s + B, k, False, evict=False,
                         recording=(RowRecording([stores[r] for r in todo], histories), None))
    return count
