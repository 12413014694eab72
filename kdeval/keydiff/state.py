"""What a run of the engine produces and can continue from: the prefilled state, the result, the figures."""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from kdeval.keydiff.cache import BudgetCache


@dataclass
class RunStats:
    """Per-run figures. Memory: CUDA peak allocated on GPU, peak RSS sampled per chunk on CPU."""

    prompt_tokens: int = 0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0
    decode_tokens_per_s: float = 0.0
    peak_kv_tokens: int = 0
    kept_tokens: int = 0
    peak_memory_bytes: int = 0
    kv_cache_bytes: int = 0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass
class PrefillState:
    """A prefilled (and compressed) cache that generation can continue from; ``fork`` before reusing it."""

    cache: BudgetCache
    seen: int
    last_logits: torch.Tensor  # [batch, vocab] logits of the last prompt token
    peak_kv_tokens: int = 0
    steps: int = 0
    chunk_logits: list[torch.Tensor] = field(default_factory=list)  # [batch, t, vocab] per chunk, if collected
    released: bool = False  # handed back to its engine's pool (Engine.release): not to be used again

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
            into.last_logits = self.last_logits.clone()
            into.chunk_logits = []
            return into
        graphs, self.cache.graphs = self.cache.graphs, {}  # captured graphs are bound to these buffers
        try:
            cache = copy.deepcopy(self.cache)
        finally:
            self.cache.graphs = graphs
        return PrefillState(cache, self.seen, self.last_logits.clone(), self.peak_kv_tokens, self.steps)

    @property
    def logits(self) -> torch.Tensor:
        """All collected prompt logits ``[batch, prompt_tokens, vocab]`` (``collect_logits=True`` only)."""
        return torch.cat(self.chunk_logits, dim=1)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # generated ids per batch row, eos excluded
    stats: RunStats
    state: PrefillState
