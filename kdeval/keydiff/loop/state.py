"""What a run of the engine produces and can continue from: the prefilled state, the result, the figures."""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.policy.interface import add_range, held_tokens
from kdeval.keydiff.attention.repeat_prompt import RepeatProgress


@dataclass
class RunStats:
    """Per-run figures.

    - ``peak_kv_tokens``: the most tokens one layer held during a forward; ``kept_tokens``: the most one layer
      keeps at the end (every layer's count under a uniform budget).
    - ``peak_kv_bytes``: the most bytes of keys and values the request held *by its own tokens* during a forward,
      all layers: each layer's held tokens plus the chunk fed, at that layer's bytes per token
      (:func:`kdeval.keydiff.loop.memory.own_peak_bytes`; a quantized store's record plus the chunk in full
      precision). What the request costs under its policy, the same whether it ran alone, in a batch or with
      steps replayed in a group; positions and per-token policy state are not counted.
    - ``kv_cache_bytes``: the same at the end of the call (the tokens kept).
    - ``kv_buffer_bytes``: the most bytes of key/value buffers *allocated* while the request ran, its batch's
      whole (padding, other rows and slots allocated ahead included): how the request was executed, like its
      timings, not what it costs.
    - ``peak_memory_bytes``: the process or GPU peak, weights included; ``memory_kind`` says which:
      ``"cuda_max_allocated"`` (``torch.cuda.max_memory_allocated``) or ``"process_rss"`` (peak RSS sampled
      per chunk and decode step).

    A request of a batch (``Engine.generate_batch``) has its own token counts (``prompt_tokens``,
    ``decode_tokens``, ``peak_kv_tokens``, ``kept_tokens``) and KV bytes (``peak_kv_bytes``, ``kv_cache_bytes``:
    what it has alone); ``ttft_s`` runs from the start of the batch, ``decode_s`` from the request's first token
    to its last, ``peak_memory_bytes`` and ``kv_buffer_bytes`` are the batch's.
    """

    prompt_tokens: int = 0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0
    decode_tokens_per_s: float = 0.0
    peak_kv_tokens: int = 0
    kept_tokens: int = 0
    peak_memory_bytes: int = 0
    kv_cache_bytes: int = 0
    peak_kv_bytes: int = 0
    memory_kind: str = ""
    kv_buffer_bytes: int = 0
    #: prompt steps replayed from steps other cells computed alike (kdeval/keydiff/step/shared.py), not computed here
    replayed_steps: int = 0
    #: tokens of the forwards a policy runs besides the prompt's and the answer's (KVzip's repeat passes,
    #: kdeval/keydiff/attention/repeat_prompt.py), per row; their time is in ``ttft_s``
    extra_forward_tokens: int = 0
    #: of ``kv_cache_bytes``, the windowed layers' (sliding or chunked attention: kept as the model sees them,
    #: not by the policy; 0 on a model without them)
    windowed_kv_bytes: int = 0
    #: bytes of the recurrent layers' conv and recurrent states (linear attention, Mamba, short conv): constant in
    #: the prompt's length, never the policy's, and not part of the K/V bytes (0 on a model without them)
    state_bytes: int = 0
    #: the model's layers by kind (``"18 layers: 3 full, 15 sliding 512"``): the budget is per full layer
    layer_kinds: str = ""

    @classmethod
    def of_run(cls, *, prompt_tokens: int, ttft_s: float, decode_s: float, decode_tokens: int, peak_kv_tokens: int,
               kept_tokens: int, peak_memory_bytes: int, memory_kind: str, kv_cache_bytes: int,
               peak_kv_bytes: int) -> "RunStats":
        """The figures of one request; its decode rate counts the tokens after the first (0 below two)."""
        rate = (decode_tokens - 1) / decode_s if decode_tokens > 1 and decode_s > 0 else 0.0
        return cls(prompt_tokens=prompt_tokens, ttft_s=ttft_s, decode_s=decode_s, decode_tokens=decode_tokens,
                   decode_tokens_per_s=rate, peak_kv_tokens=peak_kv_tokens, kept_tokens=kept_tokens,
                   peak_memory_bytes=peak_memory_bytes, kv_cache_bytes=kv_cache_bytes, peak_kv_bytes=peak_kv_bytes,
                   memory_kind=memory_kind)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass
class PrefillState:
    """A cache and its counters after prefill, and also after generation (``GenerationResult.state``): what a
    later ``prefill`` or ``generate`` can continue from; ``fork`` before reusing it.

    ``protected``: ranges ``[start, end)`` of absolute positions fed with ``evict=False`` (the question under
    kvpress's protocol): those tokens are never evicted and are held on top of the budget.
    """

    cache: BudgetCache
    seen: int
    last_logits: torch.Tensor  # [batch, vocab] logits of the last prompt token
    peak_kv_tokens: int = 0
    steps: int = 0
    chunk_logits: list[torch.Tensor] = field(default_factory=list)  # [batch, t, vocab] per chunk, if collected
    released: bool = False  # handed back to its engine's pool (Engine.release): not to be used again
    protected: list[tuple[int, int]] = field(default_factory=list)
    peak_kv_bytes: int = 0  # RunStats.peak_kv_bytes over this state's steps
    kv_buffer_bytes: int = 0  # RunStats.kv_buffer_bytes over this state's steps
    #: what the cache holds, as a hash of every step fed so far (kdeval/keydiff/step/shared.py); ``None``: unknown
    #: (a step that could not be shared ran, or a token was decoded)
    history: str | None = ""
    replayed: int = 0  # prompt steps replayed from a shared store instead of computed (RunStats.replayed_steps)
    extra_forward_tokens: int = 0  # RunStats.extra_forward_tokens over this state's steps
    #: a repeat-pass policy's progress (kdeval/keydiff/attention/repeat_prompt.py); ``None``: none ran on this state yet
    repeat: RepeatProgress | None = None

    @property
    def n_protected(self) -> int:
        """Tokens per layer and KV head that eviction never frees (all of them are in the cache)."""
        return held_tokens(self.protected)

    def protect(self, start: int, end: int) -> None:
        """Mark positions ``[start, end)`` protected (merged with a range that ends at ``start``)."""
        add_range(self.protected, start, end)

    def check_usable(self) -> None:
        if self.released:
            raise ValueError("state: it was released to the engine's pool (Engine.release) and its cache now "
                             "belongs to another request; fork it before releasing to keep it")

    def fork(self, into: "PrefillState | None" = None) -> "PrefillState":
        """An independent copy to continue from (this state is left as it is).

        ``into``: an earlier fork of the same static-layout cache (the graph path) whose buffers are
        overwritten in place and returned, so the CUDA graphs it captured stay valid (they are bound to its
        buffers). Without it, or when it does not match, the cache is deep-copied and graphs are captured anew.
        """
        self.check_usable()
        if into is not None and not into.released and into.cache.can_copy_from(self.cache):
            into.cache.copy_from(self.cache)
            into.seen, into.peak_kv_tokens, into.steps = self.seen, self.peak_kv_tokens, self.steps
            into.protected, into.peak_kv_bytes = list(self.protected), self.peak_kv_bytes
            into.kv_buffer_bytes = self.kv_buffer_bytes
            into.history, into.replayed = self.history, self.replayed
            into.extra_forward_tokens, into.repeat = self.extra_forward_tokens, self._repeat_copy()
            into.last_logits = self.last_logits.clone()
            into.chunk_logits = []
            return into
        graphs, self.cache.graphs = self.cache.graphs, {}  # captured graphs are bound to these buffers
        try:
            cache = copy.deepcopy(self.cache)
        finally:
            self.cache.graphs = graphs
        return PrefillState(cache, self.seen, self.last_logits.clone(), self.peak_kv_tokens, self.steps,
                            protected=list(self.protected), peak_kv_bytes=self.peak_kv_bytes,
                            kv_buffer_bytes=self.kv_buffer_bytes, history=self.history,
                            replayed=self.replayed, extra_forward_tokens=self.extra_forward_tokens,
                            repeat=self._repeat_copy())

    def _repeat_copy(self) -> RepeatProgress | None:
        return self.repeat.copy() if self.repeat is not None else None

    @property
    def logits(self) -> torch.Tensor:
        """All collected prompt logits ``[batch, prompt_tokens, vocab]`` (``collect_logits=True`` only)."""
        return torch.cat(self.chunk_logits, dim=1)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # generated ids per batch row, eos excluded
    stats: RunStats
    state: PrefillState
