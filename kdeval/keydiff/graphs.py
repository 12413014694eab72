"""The chunk step (chunk forward + scoring + eviction) captured once as a CUDA graph and replayed.

With the static slot layout (kdeval/keydiff/cache.py) every full chunk has the same shapes from the first chunk
on: the chunk is written to slots ``[N, N + t)``, attention runs over ``N + t`` keys under a mask computed on
the device from the count of tokens seen, scoring and ``topk`` see ``N + t`` slots, and the compaction moves
``t`` slots. Only the token ids, their positions and the count of tokens seen change, so they live in static
device buffers that are refilled before each replay. The Python-side bookkeeping of the cache (its length)
is advanced by every replay from the host (``BudgetCache.advance_static``), so nothing on the host depends on
a replayed value.

The first call runs eagerly, on the side stream the capture will use (so lazily created per-stream state such
as library workspaces exists before capture), and is the warm-up; the second call captures, then replays.
``emulate=True`` (tests without CUDA) runs the same buffers through a plain call instead of a graph.

The step that is captured (kdeval/keydiff/step.py) is passed to every call, not kept: the cache holds this object
(``cache.graphs``) and the step's pool holds released caches, so keeping it would make a reference cycle that
keeps a cache and the graph's memory pool alive until the garbage collector runs.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from kdeval.keydiff.cache import BudgetCache


class DeviceStep(Protocol):
    """What is captured: a step's forward + eviction with no host synchronisation."""

    def device_step(self, cache: "BudgetCache", ids: torch.Tensor, positions: torch.Tensor,
                    seen_after: torch.Tensor, steps: int, all_logits: bool) -> torch.Tensor: ...


class CapturedStep:
    """One graph for one cache, batch size and chunk length ``t`` (``chunk_size`` or 1), captured from one step
    (``owner``, weakly: it recorded that step's policy and plan) on ``device`` (``emulate``: plain calls)."""

    def __init__(self, step: DeviceStep, batch: int, t: int, device: torch.device, emulate: bool = False):
        self.owner, self.t = weakref.ref(step), t
        dev = device
        self.ids = torch.zeros(batch, t, dtype=torch.long, device=dev)
        self.offsets = torch.arange(t, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.seen_after = torch.zeros((), dtype=torch.long, device=dev)
        self.emulate = dev.type != "cuda" or emulate
        self.stream = None if self.emulate else torch.cuda.Stream(device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.warmed = False

    def _fn(self, step: DeviceStep, cache: "BudgetCache") -> torch.Tensor:
        return step.device_step(cache, self.ids, self.positions, self.seen_after, 0, False)

    def _fill(self, ids: torch.Tensor, seen: int) -> None:
        self.ids.copy_(ids)
        torch.add(self.offsets, seen, out=self.positions)
        self.seen_after.fill_(seen + self.t)

    def run(self, step: DeviceStep, cache: "BudgetCache", ids: torch.Tensor, seen: int) -> torch.Tensor:
        """One step of ``cache`` (always the same one) for ``ids [batch, t]`` from position ``seen`` by ``step``
        (always its owner); returns logits ``[batch, 1, vocab]``."""
        self._fill(ids, seen)
        if self.emulate:
            return self._fn(step, cache).clone()
        if not self.warmed:
            self.warmed = True
            current = torch.cuda.current_stream()
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                logits = self._fn(step, cache).clone()
            current.wait_stream(self.stream)
            return logits
        if self.graph is None:
            self._capture(step, cache)  # its Python pass did this step's bookkeeping
        else:
            cache.advance_static(self.t)
        self.graph.replay()
        return self.logits.clone()

    def _capture(self, step: DeviceStep, cache: "BudgetCache") -> None:
        # The capture records kernels without running them; replay() right after runs this step.
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=self.stream):
            self.logits = self._fn(step, cache)
        self.graph = graph
