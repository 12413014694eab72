"""The requests of ``Engine.generate_batch``, checked and made rows: per-request arguments broadcast to one per
prompt, each prompt's ids and protected question checked as ``Engine.generate`` checks them, with errors naming
the argument and the request (``prompts[2]: ...``); and the one-at-a-time path of a head-shared pool.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kdeval.keydiff.attention.capture import RAGGED_IMPL
from kdeval.keydiff.loop.decoding import Request, check_protect, prompt_steps
from kdeval.keydiff.plan.plan import Plan, check_ids
from kdeval.keydiff.loop.state import GenerationResult, PrefillState


@dataclass
class Row(Request):
    """A request of the batch, with the counters of its own cache (``state``: seen, steps, protected ranges,
    peaks, last prompt logits; its cache is filled in when it leaves the batch)."""

    state: PrefillState | None = None


def as_ids(prompt, i: int) -> torch.Tensor:
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids, got shape {tuple(ids.shape)}")
    return ids


def per_row(name: str, value, n: int) -> list:
    if isinstance(value, (int, type(None))) and not isinstance(value, bool):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name}: expected one value per prompt ({n}), got {len(value)}")
    return value


def requests(default_max_new: int, prompts: Sequence, max_new_tokens, states, protect_last) -> tuple[list, list, list]:
    """The per-request start states, generation lengths and protected counts of a ``generate_batch`` call,
    broadcast to one per prompt and checked (``ValueError`` naming the argument and the request)."""
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts: expected at least one prompt")
    max_new = per_row("max_new_tokens", default_max_new if max_new_tokens is None else max_new_tokens, n)
    starts = [states] * n if isinstance(states, PrefillState) else per_row("states", states, n)
    protect = per_row("protect_last", protect_last, n)
    for i, (m, state) in enumerate(zip(max_new, starts)):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"max_new_tokens[{i}]: must be an integer >= 0, got {m!r}")
        if state is not None and (not isinstance(state, PrefillState) or state.last_logits.shape[0] > 1):
            raise ValueError(f"states[{i}]: expected a batch-1 PrefillState or None")
    return starts, max_new, protect


def batch_rows(plan: Plan, prompts: Sequence, max_new_tokens, states, protect_last, model_attention: str
               ) -> tuple[list[Row], list[PrefillState | None]]:
    """The checked rows of a ``generate_batch`` call (``ValueError`` naming the argument and the request) and
    their start states: each prompt's ids on the device, its steps, its generation length, its counters."""
    starts, max_new, protect = requests(plan.config.max_new_tokens, prompts, max_new_tokens, states, protect_last)
    ids = [as_ids(p, i) for i, p in enumerate(prompts)]
    if model_attention not in ("sdpa", RAGGED_IMPL) and not (plan.sinks and model_attention == "eager"):
        raise ValueError(f"prompts: a batch of requests runs on SDPA with a padding mask; the model uses "
                         f"{model_attention!r} (load it with attn_implementation='sdpa', or send one request at a time)")
    rows: list[Row] = []
    for i in range(len(prompts)):
        state = starts[i]
        try:
            ids[i] = check_ids(plan, ids[i].unsqueeze(0), state, max_new[i])[0]
        except ValueError as e:
            raise ValueError(f"prompts[{i}]: {e}") from None
        p = check_protect(protect[i], ids[i].shape[0], f"protect_last[{i}]")
        counters = PrefillState(None, state.seen, None, state.peak_kv_tokens, state.steps,
                                protected=list(state.protected), peak_kv_bytes=state.peak_kv_bytes) if state else \
            PrefillState(None, 0, None)
        rows.append(Row(i, prompt_steps(ids[i], plan.config.chunk_size, p), max_new[i], state=counters))
    return rows, starts


def one_at_a_time(generate: Callable[..., GenerationResult], default_max_new: int, prompts: Sequence,
                  max_new_tokens, eos_token_id, states, protect_last,
                  decode_evict: bool) -> list[GenerationResult]:
    """``Engine.generate_batch`` for a policy whose KV heads share a pool of slots (``PolicyNeeds.shares_heads``,
    kdeval/keydiff/cache/headpool.py) or that runs a repeat pass (``PolicyNeeds.repeat``, KVzip): each request by
    ``Engine.generate``, alone, so each gets exactly its batch-1 result (a ragged step over a pool would need every
    row's own head counts, a ragged repeat pass every row's own repeat prompt; the batch's throughput is lost, and
    ``on_batch_step`` is not called)."""
    starts, max_new, protect = requests(default_max_new, prompts, max_new_tokens, states, protect_last)
    out = []
    for i, prompt in enumerate(prompts):
        state = starts[i]
        try:
            out.append(generate(as_ids(prompt, i).unsqueeze(0), max_new[i], eos_token_id,
                                       state.fork() if state is not None else None, protect_last=protect[i],
                                       decode_evict=decode_evict))
        except ValueError as e:
            raise ValueError(f"prompts[{i}]: {e}") from None
    return out
