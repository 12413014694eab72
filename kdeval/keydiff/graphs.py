"""The steady-state step (chunk forward + scoring + eviction) captured once as a CUDA graph and replayed.

Once a slot cache holds exactly ``budget`` tokens, every full chunk (and every decode step) has the same
shapes: the chunk is written to slots ``[N, N + t)``, attention runs over ``N + t`` keys with the same mask,
scoring and ``topk`` see ``N + t`` tokens, and the compaction moves ``t`` slots. Only the token ids, their
positions and the count of tokens seen change, so they live in static device buffers that are refilled before
each replay. Python-side bookkeeping of the cache (length == budget before and after) is the same for every
step, so the capture's own pass through it leaves it right.

``emulate=True`` (tests without CUDA) runs the same buffers through a plain call instead of a graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kdeval.keydiff.cache import BudgetCache
    from kdeval.keydiff.engine import Engine


class CapturedStep:
    """One graph for one cache, batch size and chunk length ``t`` (``chunk_size`` or 1)."""

    def __init__(self, engine: "Engine", cache: "BudgetCache", batch: int, t: int):
        self.engine, self.cache, self.t = engine, cache, t
        dev = engine.device
        self.ids = torch.zeros(batch, t, dtype=torch.long, device=dev)
        self.offsets = torch.arange(t, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.seen_after = torch.zeros((), dtype=torch.long, device=dev)
        self.emulate = dev.type != "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.eager_runs = 0

    def _fn(self) -> torch.Tensor:
        return self.engine._device_step(self.cache, self.ids, self.positions, self.seen_after, 0, False)

    def _fill(self, ids: torch.Tensor, seen: int) -> None:
        self.ids.copy_(ids)
        torch.add(self.offsets, seen, out=self.positions)
        self.seen_after.fill_(seen + self.t)

    def run(self, ids: torch.Tensor, seen: int) -> torch.Tensor:
        """Run one step for ``ids [batch, t]`` starting at position ``seen``; returns logits ``[batch, 1, vocab]``."""
        self._fill(ids, seen)
        if self.emulate or self.eager_runs == 0:
            # The first steady-state step runs eagerly (the warm-up for these exact shapes).
            self.eager_runs += 1
            return self._fn().clone()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits.clone()

    def _capture(self) -> None:
        # The capture records kernels without running them; replay() right after runs this step.
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.logits = self._fn()
        self.graph = graph
