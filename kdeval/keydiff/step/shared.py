"""Prompt steps that the cells of a group compute alike: each forward recorded once, replayed into every cell.

Until a cell first evicts, its cache holds exactly what the full cache holds: every token it was fed, at its
absolute position. The forward of its next prompt step therefore writes the same keys and values and gives the
same logits as in any other cell fed the same tokens so far, under the same attention function — whatever the
policy or the budget, which only decide what is kept *after* the forward. :class:`SharedSteps` records such a
forward once (the chunk's keys and values per layer, the attention rows, queries and hidden states every member policy reads,
the logits) and replays it into the next cell that reaches the same point: the record's keys and values are
written into that cell's own cache as the model would write them, and the cell's own eviction runs on them
(:meth:`kdeval.keydiff.step.step.Step.run`). Results are the cell's own, bit for bit: the same tokens, kept sets,
scores and KV bytes as the cell run alone (tests/keydiff/test_shared_steps.py).

A state's *history* (``PrefillState.history``) names what its cache holds: a hash over every step fed so far
(its token ids, its positions and the forward's :func:`forward_signature`). A step is replayed only into a state
that evicted nothing yet (every layer holds every token seen) and whose history equals the recorder's, so one
store serves any mixture of cells: chunk sizes, protocols and shared contexts that feed different steps simply
never meet. Decode steps are not shared (a state that decodes loses its history).

What shares a forward (:func:`forward_signature`): SDPA with or without captured attention rows (the rows are
computed beside SDPA's output, which is the same); not H2O's fused rows, whose output comes from the captured
probabilities (such cells share among themselves), not per-layer budgets' own attention (idem), not the
static layout of the graph path nor a head-shared pool (their attention spans empty slots whose number depends on
the budget): those run every step themselves.

Bound: a step is recorded only while the tokens held after it are at most ``max_tokens`` (the group's largest
budget plus a chunk), so the store holds at most that many tokens per layer and KV head for one prompt; a cell
that never evicts (``full``) runs its later steps itself. ``chunk_bounds`` narrows it per chunk size: a step of
chunk size B only ever serves cells of that B (its shape is in its key), so it is worth recording only up to
their largest budget plus B. Call :meth:`SharedSteps.clear` between prompts.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

import torch

from kdeval.keydiff.attention.capture import CAPTURE_IMPL, SDPA_IMPL, AttentionCapture, AttentionNeed
from kdeval.keydiff.cache.budget_cache import BudgetCache, RowLayer, StateRowLayer
from kdeval.keydiff.cache.state_layer import RecurrentStates, StateLayer, States
from kdeval.keydiff.policy.interface import Policy

if TYPE_CHECKING:
    from kdeval.keydiff.plan.plan import Plan
    from kdeval.keydiff.loop.state import PrefillState

#: a captured attention's identity: which rows, and whether the logits were float32 (``score_precision``)
CaptureKey = tuple[AttentionNeed, bool]


def forward_signature(plan: "Plan") -> str | None:
    """What decides a step's forward output besides the cache's content and the step's tokens, or ``None`` when a
    plan's steps are never shared (the static layout of the graph path, a head-shared pool)."""
    if plan.use_graphs or plan.shares_heads:
        return None
    # a quantized store changes what the cache holds from its first quantized token on: cells share only with
    # cells of the same store (the history of steps then decides its content, as for any cell)
    quant = f"|{plan.kv_quant.label}" if plan.kv_quant is not None else ""
    need = plan.needs.attention
    if need is not None and need.kind == "all":  # the output is computed from the captured probabilities
        return f"fused|{plan.step_attention}|{plan.config.score_precision}{quant}"
    impl = plan.step_attention
    if impl in (SDPA_IMPL, CAPTURE_IMPL):  # the same SDPA call under the same mask; rows are computed beside it
        impl = "sdpa"
    return f"{impl}|{plan.model_attention}{quant}"


def capture_key(need: AttentionNeed, plan: "Plan") -> CaptureKey:
    return need, plan.config.score_precision == "float32"


class MultiCapture:
    """Several :class:`AttentionCapture` recorded in one forward (the attention functions' capture interface):
    the rows of every member's need, beside SDPA's output (never fused)."""

    def __init__(self, captures: Iterable[AttentionCapture]):
        self.captures = list(captures)

    def fuses_output(self, query: torch.Tensor) -> bool:
        return False

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float,
               mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> None:
        for capture in self.captures:
            capture.record(layer_idx, query, key, scaling, mask, sinks)


@dataclass
class StepRecord:
    """One recorded prompt step: what the forward wrote and returned, and what the member policies read."""

    keys: list[torch.Tensor | None]  # per layer [batch, kv_heads, t, head_dim], rotated as the cache holds them
    values: list[torch.Tensor | None]  # per layer [batch, kv_heads, t, value_dim] (None: a recurrent layer's)
    logits: torch.Tensor  # [batch, t or 1, vocab]
    attention: dict[CaptureKey, dict[int, torch.Tensor]] = field(default_factory=dict)  # need -> layer -> rows
    queries: dict[int, torch.Tensor] | None = None  # layer -> [batch, q_heads, t, head_dim] before RoPE
    #: layer -> its recurrent states after the step: a state cannot be resumed from keys, so a replay restores it
    states: dict[int, States] = field(default_factory=dict)

    def serves(self, plan: "Plan") -> bool:
        """Whether the record holds everything this plan's policy reads from a step."""
        need = plan.needs.attention
        if need is not None and capture_key(need, plan) not in self.attention:
            return False
        return plan.needs.queries is None or self.queries is not None


class SharedSteps:
    """Recorded prompt steps of one group of cells (module docstring), for the prompt they are running now.

    ``policies``: every member's policy, so that a recording captures what each of them reads;
    ``max_tokens``: record a step only while the tokens held after it are at most this many (``None``: no
    bound); ``chunk_bounds``: the same per chunk size, for steps of cells of that chunk size (a size it does not
    name: ``max_tokens``)."""

    def __init__(self, policies: Iterable[Policy], max_tokens: int | None = None,
                 chunk_bounds: Mapping[int, int] | None = None):
        needs = [p.needs() for p in policies if p.evicts]
        self.attention = list(dict.fromkeys(n.attention for n in needs if n.attention is not None))
        self.queries = any(n.queries is not None for n in needs)
        self.max_tokens = max_tokens
        self.chunk_bounds = dict(chunk_bounds or {})
        self.records: dict[str, StepRecord] = {}
        #: steps replayed and recorded since the store was made
        self.replayed = 0
        self.recorded = 0

    def clear(self) -> None:
        """Forget the recorded steps (the next prompt shares nothing with them)."""
        self.records.clear()

    def step_key(self, plan: "Plan", state: "PrefillState", ids: torch.Tensor) -> str | None:
        """The history ``state`` will have after feeding ``ids [batch, t]`` (``None``: not shareable)."""
        sig = forward_signature(plan)
        if sig is None or state.history is None or not undiverged(state, plan):
            return None
        return next_history(state.history, sig, state.seen, ids)

    def find(self, key: str | None, plan: "Plan") -> StepRecord | None:
        rec = self.records.get(key) if key is not None else None
        return rec if rec is not None and rec.serves(plan) else None

    def bound(self, chunk: int) -> int | None:
        """The most tokens held after a recorded step of a cell of chunk size ``chunk`` (``None``: no bound)."""
        return self.chunk_bounds.get(chunk, self.max_tokens)

    def wants(self, key: str | None, state: "PrefillState", t: int, chunk: int) -> bool:
        """Whether to record the step about to run (shareable, and within the bound of a cell of chunk size
        ``chunk``)."""
        if key is None or key in self.records:
            return False
        bound = self.bound(chunk)
        return bound is None or state.seen + t <= bound

    def serves_next(self, plan: "Plan", state: "PrefillState", ids: torch.Tensor) -> bool:
        """Whether the step of ``ids [1, t]`` after ``state`` would be replayed from this store or recorded in it
        (``Engine.prefill_shared`` feeds a cell's steps while they are)."""
        key = self.step_key(plan, state, ids)
        return self.find(key, plan) is not None or self.wants(key, state, ids.shape[1], plan.config.chunk_size)

    def recording_capture(self, plan: "Plan") -> tuple[AttentionCapture | MultiCapture | None, dict]:
        """The capture a recording forward passes (every member's rows for a plan whose output SDPA gives; its
        own need for a fused plan) and the captures by :data:`CaptureKey`."""
        own = plan.needs.attention
        f32 = plan.config.score_precision == "float32"
        if own is not None and own.kind == "all":
            cap = AttentionCapture(own, float32_logits=f32)
            return cap, {(own, f32): cap}
        # the model's own attention (no SDPA of the engine's) captures nothing; the engine's captures every row
        wanted = [] if plan.step_attention is None else [n for n in self.attention if n.kind != "all"]
        if own is not None and own not in wanted:
            wanted.append(own)
        caps = {(n, f32): AttentionCapture(n, float32_logits=f32) for n in wanted}
        if not caps:
            return None, {}
        if len(caps) == 1:
            return next(iter(caps.values())), caps
        return MultiCapture(caps.values()), caps

    def store(self, key: str, cache: BudgetCache, logits: torch.Tensor, captures: dict,
              queries: dict[int, torch.Tensor] | None) -> None:
        """Record the step just run on ``cache`` (its chunk still pending, before eviction)."""
        self.keep(key, record_of(cache, logits, captures, queries))

    def keep(self, key: str, record: StepRecord) -> None:
        """Hold ``record`` as the step whose history is ``key``."""
        self.records[key] = record
        self.recorded += 1


def next_history(history: str, signature: str, seen: int, ids: torch.Tensor) -> str:
    """The history of a state (``history``, ``seen`` tokens) after feeding ``ids [batch, t]`` under a forward of
    ``signature`` (:func:`forward_signature`): the key its step is recorded and found under."""
    h = hashlib.sha256(history.encode())
    h.update(f"|{signature}|{seen}|{tuple(ids.shape)}|".encode())
    h.update(ids.detach().to("cpu", torch.int64).numpy().tobytes())
    return h.hexdigest()


def record_of(cache: BudgetCache, logits: torch.Tensor, captures: dict, queries: dict[int, torch.Tensor] | None,
              row: int | None = None) -> StepRecord:
    """Copies of what the step just run on ``cache`` wrote (its chunk still pending) and what the member policies
    read, of every batch row (``row``: of that one only, as a batch-1 step would have recorded it)."""
    pick = (lambda x: x.clone()) if row is None else (lambda x: x[row : row + 1].clone())  # noqa: E731
    keys, values, states = [], [], {}
    for idx, layer in enumerate(cache.layers):
        if isinstance(layer, RecurrentStates):
            states[idx] = {key: pick(t) for key, t in layer.states().items()}
        if isinstance(layer, StateLayer):
            keys.append(None)
            values.append(None)
            continue
        lo, hi = layer.length, layer.length + layer.pending
        keys.append(pick(layer.keys[:, :, lo:hi]))
        values.append(pick(layer.values[:, :, lo:hi]))
    rows = {k: {i: pick(r) for i, r in cap.by_layer.items()} for k, cap in captures.items()}
    copies = lambda d: {i: pick(x) for i, x in d.items()} if d is not None else None  # noqa: E731
    return StepRecord(keys, values, pick(logits), rows, copies(queries), states)


def undiverged(state: "PrefillState", plan: "Plan") -> bool:
    """Whether ``state``'s cache evicted nothing so far: an eager cache whose every layer holds what the
    full cache holds (every token seen; a windowed layer its window, cut alike in every cell)."""
    cache = state.cache
    if not isinstance(cache, BudgetCache) or cache.static_base is not None:
        return False
    return all(isinstance(layer, StateLayer) or type(layer) in (RowLayer, StateRowLayer) and not layer.pending
               and layer.length == (plan.kind(i).kept_count(state.seen) if plan.trims(i) else state.seen)
               for i, layer in enumerate(cache.layers))


def member_capture(record: StepRecord, plan: "Plan") -> AttentionCapture | None:
    """The capture a replayed step hands the plan's eviction: its own need's rows from the record (copies: a
    policy may work on them in place)."""
    need = plan.needs.attention
    if need is None:
        return None
    key = capture_key(need, plan)
    cap = AttentionCapture(need, float32_logits=key[1])
    cap.by_layer = {i: r.clone() for i, r in record.attention[key].items()}
    return cap
