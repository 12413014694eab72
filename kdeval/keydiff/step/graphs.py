"""The chunk step (chunk forward + scoring + eviction) captured once as a CUDA graph and replayed.

With the static slot layout (kdeval/keydiff/cache/budget_cache.py) every full chunk has the same shapes from the first chunk
on: the chunk is written to slots ``[N, N + t)``, attention runs over ``N + t`` keys under a mask computed on
the device from the count of tokens seen, scoring and ``topk`` see ``N + t`` slots, and the compaction moves
``t`` slots. Only the token ids, their positions and the count of tokens seen change, so they live in static
device buffers that are refilled before each replay. The Python-side bookkeeping of the cache (its length)
is advanced by every replay from the host (``BudgetCache.advance_static``), so nothing on the host depends on
a replayed value.

The first call runs eagerly, on the side stream the capture will use (so lazily created per-stream state such
as library workspaces exists before capture), and is the warm-up; the second call captures, then replays.
:class:`CapturedStep` is the engine's default graph runner; a test gives the engine another one
(``Engine(graph_runner=...)``) that runs the same static inputs through plain calls, on a CPU.

The step that is captured (kdeval/keydiff/step/step.py) is passed to every call, not kept: the cache holds this object
(``cache.graphs``) and the step's pool holds released caches, so keeping it would make a reference cycle that
keeps a cache and the graph's memory pool alive until the garbage collector runs.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from kdeval.keydiff.cache.budget_cache import BudgetCache


class DeviceStep(Protocol):
    """What is captured: a step's forward + eviction with no host synchronisation."""

    def device_step(self, cache: "BudgetCache", ids: torch.Tensor, positions: torch.Tensor,
                    seen_after: torch.Tensor, steps: int, all_logits: bool) -> torch.Tensor: ...


class StepInputs:
    """The static inputs of one captured step (token ids ``[batch, t]``, positions ``[t]``, the count of tokens
    seen after it, a 0-d tensor), refilled before each run, for one cache, batch size and chunk length ``t``
    (``chunk_size`` or 1) of one step (``owner``, weakly: a graph records that step's policy and plan)."""

    def __init__(self, step: DeviceStep, batch: int, t: int, device: torch.device):
        self.owner, self.t = weakref.ref(step), t
        self.ids = torch.zeros(batch, t, dtype=torch.long, device=device)
        self.offsets = torch.arange(t, device=device)
        self.positions = torch.zeros(t, dtype=torch.long, device=device)
        self.seen_after = torch.zeros((), dtype=torch.long, device=device)

    def call(self, step: DeviceStep, cache: "BudgetCache") -> torch.Tensor:
        """``step``'s forward + eviction of ``cache`` on these inputs: what a graph captures."""
        return step.device_step(cache, self.ids, self.positions, self.seen_after, 0, False)

    def fill(self, ids: torch.Tensor, seen: int) -> None:
        """Refill the inputs with ``ids [batch, t]`` at positions ``seen .. seen + t - 1``."""
        self.ids.copy_(ids)
        torch.add(self.offsets, seen, out=self.positions)
        self.seen_after.fill_(seen + self.t)


class CapturedStep(StepInputs):
    """:class:`StepInputs` whose step is captured as a CUDA graph on ``device`` and replayed (module docstring)."""

    def __init__(self, step: DeviceStep, batch: int, t: int, device: torch.device):
        super().__init__(step, batch, t, device)
        self.stream = torch.cuda.Stream(device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.warmed = False

    def run(self, step: DeviceStep, cache: "BudgetCache", ids: torch.Tensor, seen: int) -> torch.Tensor:
        """One step of ``cache`` (always the same one) for ``ids [batch, t]`` from position ``seen`` by ``step``
        (always its owner); returns logits ``[batch, 1, vocab]``."""
        self.fill(ids, seen)
        if not self.warmed:
            self.warmed = True
            current = torch.cuda.current_stream()
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                logits = self.call(step, cache).clone()
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
            self.logits = self.call(step, cache)
        self.graph = graph
