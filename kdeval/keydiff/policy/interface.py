"""The eviction-policy interface every policy (KeyDiff and the baselines) implements.

After every chunk of prompt tokens and every generated token, the engine hands each layer's cached keys to the
policy's :meth:`Policy.score`; the engine then keeps, per (batch row, KV head), the layer's budget of
highest-scoring tokens (``budget`` N, or the layer's own share under :meth:`Policy.layer_budgets`); a policy that
``shares_heads`` (AdaKV) keeps instead the best ``H * N`` tokens of a layer across its ``H`` KV heads
(kdeval/keydiff/cache/headpool.py). Tokens the policy protects (the first ``n_sink`` positions and the most
recent ``n_recent(budget)`` positions) are always kept.

Tensor shapes, everywhere in this package:

- ``keys``: ``[batch, kv_heads, tokens, head_dim]`` (already rotated by RoPE)
- ``positions``: ``[batch, kv_heads, tokens]`` int64 absolute positions of the cached tokens
- scores: ``[batch, kv_heads, tokens]``, higher = keep
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import torch

from kdeval.keydiff.attention.capture import AttentionNeed
from kdeval.keydiff.attention.queries import QueryNeed, RecentQueries
from kdeval.keydiff.attention.reads import LayerProjections
from kdeval.keydiff.attention.repeat_prompt import RepeatNeed


@dataclass
class ScoreContext:
    """What a policy may look at besides the keys, for one layer at one eviction step.

    - ``positions``: ``[batch, kv_heads, tokens]`` absolute positions of the cached tokens.
    - ``seen``: tokens processed so far, this chunk included (the next position is ``seen``); an int, or a
      0-d device tensor when the step runs as a CUDA graph.
    - ``n_new``: tokens of the current chunk; they are the last ``n_new`` of the ``tokens`` axis.
    - ``attention``: for policies with an :class:`AttentionNeed`, the attention probabilities of the captured
      queries summed over those queries, ``[batch, kv_heads, group, tokens]`` (``group`` = query heads per
      KV head), at least float32; ``None`` otherwise.
    - ``state``: the policy's per-token state (``PolicyNeeds.token_state`` names), each
      ``[batch, kv_heads, tokens]`` float32; the policy may update it in place and it moves with the tokens it
      belongs to.
    - ``step``: how many eviction steps ran before this one (chunks and decode steps); 0 on the CUDA graph
      path, where one captured step serves every chunk (a policy that reads it says so:
      ``PolicyNeeds.reads_step``, and runs without graphs).
    - ``queries``: for policies with a :class:`QueryNeed`, the layer's recent queries before RoPE and RoPE's
      ``cos``/``sin`` ahead (:class:`kdeval.keydiff.attention.queries.RecentQueries`); ``None`` otherwise.
    - ``values``: ``[batch, kv_heads, tokens, head_dim]``, the cached values beside ``keys``
      (``PolicyNeeds.values``); ``None`` otherwise.
    - ``projections``: the layer's ``q_proj``/``k_proj``/``v_proj``/``o_proj``
      (:class:`~kdeval.keydiff.attention.reads.LayerProjections`, ``PolicyNeeds.projections``); ``None`` otherwise.
    - ``budget``: the tokens the layer keeps per KV head, N (its own share under ``layer_budgets``; a head-shared
      pool's average per head), protected ranges not counted; set by the selector before every ``score`` (0
      outside it). Rules whose stages take a fraction of N (CriticalKV) read it.
    - ``repeat``: ``[batch, kv_heads, n_new]`` float32, the scores of the step's chunk by its repeat pass
      (``PolicyNeeds.repeat``, kdeval/keydiff/attention/repeat_prompt.py) after an evicting prompt step; ``None`` at every other
      step (decoding, a protected question) and for other policies.

    What a policy reads is declared in :class:`PolicyNeeds` and filled in by the engine in every cache layout
    (kdeval/keydiff/attention/reads.py); a new read needs no edit outside the policy's file.

    In a batch of independent requests (``Engine.generate_batch``, kdeval/keydiff/cache/ragged.py) every row has its
    own count: ``seen`` is then a ``[batch, 1, 1]`` tensor, ``step`` one too where the rows' counts differ,
    ``n_new`` counts the step's columns (padding included), and the tokens axis also holds empty and padding
    slots (zero keys, positions that sort after every real one, no attention), whose scores the engine
    overrides. A score must depend only on each row's own tensors.
    """

    layer_idx: int
    positions: torch.Tensor
    seen: int | torch.Tensor
    n_new: int
    attention: torch.Tensor | None = None
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0
    queries: RecentQueries | None = None
    values: torch.Tensor | None = None
    projections: LayerProjections | None = None
    budget: int = 0
    repeat: torch.Tensor | None = None
    _order: torch.Tensor | None = field(default=None, repr=False)

    def position_order(self) -> torch.Tensor:
        """``[batch, kv_heads, tokens]`` indices that sort the tokens by position (computed once per step:
        the slot store keeps tokens out of position order, and pooling and float64 tie-breaking need it)."""
        if self._order is None:
            self._order = self.positions.argsort(dim=-1)
        return self._order


@dataclass(frozen=True)
class PolicyNeeds:
    """What a policy's scores read besides the keys and their positions. The engine decides from it how to run
    the policy: which attention rows to capture beside SDPA, which per-token state to keep, what else to hand
    ``ScoreContext`` (queries, values, the layer's projections), whether the step can be one
    captured CUDA graph (:func:`kdeval.keydiff.plan.plan.eager_reasons`), and whether selection must break ties by
    position."""

    #: attention rows of the chunk's queries, captured beside SDPA (``ScoreContext.attention``); ``None``: none
    attention: AttentionNeed | None = None
    #: names of per-token float32 state tensors that move with their tokens (``ScoreContext.state``)
    token_state: tuple[str, ...] = ()
    #: scores read ``ScoreContext.step``, the host's count of eviction steps
    reads_step: bool = False
    #: scores often tie exactly (pooled, ranked, or shared by a group of tokens): equal scores are evicted
    #: oldest first, so the kept set does not depend on which slot holds a token
    exact_ties: bool = False
    #: the layer's recent queries before RoPE and RoPE's rotation ahead (``ScoreContext.queries``); the window is
    #: kept per request between steps, so the step runs eagerly; ``None``: none
    queries: QueryNeed | None = None
    #: the cached values beside the keys (``ScoreContext.values``)
    values: bool = False
    #: the layer's attention projections, ``W_q``, ``W_k``, ``W_v``, ``W_o`` (``ScoreContext.projections``)
    projections: bool = False
    #: after every eviction the kept keys are re-rotated to contiguous RoPE positions ``0 .. n-1`` (in position
    #: order) and new tokens are fed from ``n`` (StreamingLLM's cache positions, kdeval/keydiff/attention/rerotation.py);
    #: ``ScoreContext.positions`` stay absolute; the step runs eagerly
    rerotates: bool = False
    #: a layer's ``H * N`` kept tokens are shared among its KV heads by score (AdaKV): the cache is one pool of
    #: ``H * (N + B)`` slots per layer (kdeval/keydiff/cache/headpool.py); the step runs eagerly, ragged batches one
    #: request at a time
    shares_heads: bool = False
    #: every KV head of a layer gets the same scores (TOVA's and ChunkKV's ``heads="all"``): a head-shared pool
    #: (AdaKV) cannot wrap it
    heads_alike: bool = False
    #: its :meth:`Policy.apply` rewrites the kept keys after the commit (ThinK zeroes key channels): the step
    #: runs eagerly; slot layouts and ragged batches, not a head-shared pool
    edits_kept_keys: bool = False
    #: its :meth:`Policy.apply` rewrites the kept values from the freed tokens before the commit (MergingPress,
    #: CaM); slot layouts and ragged batches, not a head-shared pool
    merges: bool = False
    #: after every evicting prompt step, a second forward of a repeat prompt over the cache scores the step's chunk
    #: (``ScoreContext.repeat``; KVzip, kdeval/keydiff/attention/repeat_prompt.py); the step runs eagerly, a ragged batch one request
    #: at a time; ``None``: none
    repeat: RepeatNeed | None = None


@dataclass
class Freed:
    """A layer's eviction before its commit, as a merging policy sees it (``LayerEviction.freed``).

    - ``values``: ``[batch, kv_heads, tokens, head_dim]``, the layer's values beside the scored keys (a view of the
      cache's buffers: what is written there is what later steps read);
    - ``slots``: ``[batch, kv_heads, k]`` int64, the slots the step frees, ``k`` the most any row frees;
    - ``kept``: ``[batch, kv_heads, tokens]`` bool, the slots that stay.

    ``slots`` may name slots that hold no token (the static layout's empty head slots, a ragged batch's empty
    and padding slots) or, in a ragged batch's rows that free fewer than ``k``, kept ones: :meth:`dropped` tells
    the real freed tokens."""

    values: torch.Tensor
    slots: torch.Tensor
    kept: torch.Tensor

    def real(self, ctx: ScoreContext) -> torch.Tensor:
        """``[batch, kv_heads, tokens]`` bool: the slots that hold a token (positions below ``ctx.seen``)."""
        return ctx.positions < ctx.seen

    def dropped(self, ctx: ScoreContext) -> torch.Tensor:
        """``[batch, kv_heads, k]`` bool: which of ``slots`` hold a token the step drops."""
        gone = self.real(ctx) & ~self.kept
        return gone.gather(-1, self.slots)


@dataclass
class Policy:
    """Base of every eviction policy: a dataclass of validated parameters plus a scoring rule."""

    name: ClassVar[str] = "policy"
    rule: ClassVar[str] = ""
    #: ``False`` for the full cache: the engine never evicts and ignores the budget.
    evicts: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the parameter when a value is out of range."""

    def needs(self) -> PolicyNeeds:
        """What the scores read besides the keys and their positions (default: nothing else)."""
        return PolicyNeeds()

    def n_sink(self) -> int:
        """How many first positions are always kept."""
        return 0

    def n_recent(self, budget: int) -> int:
        """How many most recent positions are always kept under ``budget``."""
        return 0

    def layer_budgets(self, budget: int, num_layers: int) -> list[int]:
        """Tokens each layer keeps per KV head under the engine's budget ``budget`` (N): N in every layer by
        default. A policy that spreads the budget unevenly (PyramidKV) returns ``num_layers`` integers summing
        to ``num_layers * budget``, so the cache holds as many tokens as under a uniform N; the engine then
        sizes each layer's buffer to its own budget + chunk and runs eagerly (no static layout)."""
        return [budget] * num_layers

    def head_safeguard(self, budget: int) -> int:
        """Under ``PolicyNeeds.shares_heads``: how many of each KV head's best tokens are always kept in a layer
        that keeps ``budget`` per head on average (0: none)."""
        return 0

    def check_budget(self, budget: int) -> None:
        """Refuse a budget smaller than the tokens this policy always keeps."""
        protected = self.n_sink() + self.n_recent(budget)
        if protected > budget:
            raise ValueError(
                f"budget: must be >= the {protected} tokens policy '{self.name}' always keeps "
                f"(n_sink={self.n_sink()} + recent={self.n_recent(budget)}), got {budget}"
            )

    def observe(self, ctx: ScoreContext) -> None:
        """Called after every forward for every layer, evicting or not (e.g. H2O accumulates attention here)."""

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [batch, kv_heads, tokens, head_dim]`` → scores ``[batch, kv_heads, tokens]`` (higher = keep)."""
        raise NotImplementedError

    def apply(self, eviction: "LayerEviction") -> None:
        """The one hook for what a policy does to its kept entries: commit layer ``eviction.idx``'s eviction
        (:class:`~kdeval.keydiff.step.eviction.LayerEviction`, after the selection), rewriting before the commit
        the kept values from the freed tokens, or after it the kept keys. Default: commit only. A wrapper passes
        it on to its inner policy (:class:`~kdeval.baselines.wrapping.PassesOn`)."""
        eviction.commit()

    def params(self) -> dict[str, object]:
        """The policy's parameters as a plain dict (for cell identity and display)."""
        from dataclasses import asdict

        return asdict(self)


def held_tokens(ranges: Sequence[tuple[int, int]]) -> int:
    """Tokens in the protected position ``ranges`` ``[start, end)`` (held on top of the budget)."""
    return sum(end - start for start, end in ranges)


def add_range(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    """Add positions ``[start, end)`` to the protected ``ranges``, merged with a range that ends at ``start``."""
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], end)
    else:
        ranges.append((start, end))
