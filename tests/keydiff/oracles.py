"""Test oracles the engine is checked against, plugged in through ``Engine(cache_layer=..., graph_runner=...)``.

- The *gather store* (``GATHER``): transformers' growing ``DynamicLayer``; eviction gathers the kept tokens in
  position order into new tensors (a head-shared pool: in (head, position) order into ``[0, K)``). Simple, and the
  reference the engine's in-place slot layers must equal: the same kept tokens, the same logits.
- *Emulated graphs* (``EMULATED``): the graph path's static layout and static step inputs (a 0-d tensor ``seen``)
  run with plain calls instead of CUDA graph replays, so the graph path runs on a CPU; on CUDA, the eager
  reference the captured graphs are checked against (bench/gpu_check.py).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from kdeval.keydiff.cache.budget_cache import BudgetLayerMixin
from kdeval.keydiff.step.graphs import StepInputs
from kdeval.keydiff.cache.headpool import HeadPoolLayer
from kdeval.keydiff.cache.slot_buffers import expand_index


class GatherLayer(BudgetLayerMixin, DynamicLayer):
    """transformers' growing layer; eviction gathers the kept tokens (position order) into new tensors.
    ``capacity`` is recorded, not allocated (the cache reads it to tell per-layer budgets)."""

    def __init__(self, capacity: int, state_names: tuple[str, ...] = ()):
        DynamicLayer.__init__(self)
        self.capacity = capacity
        self.state_names = tuple(state_names)
        self._init_budget()
        self.positions: torch.Tensor | None = None
        self.state: dict[str, torch.Tensor] = {}
        self._held = 0  # bytes of keys and values after the last update, before eviction gathered the kept ones

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def held_nbytes(self) -> int:
        return self._held

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = DynamicLayer.update(self, key_states, value_states)
        b, h, t = key_states.shape[:3]
        new_pos = self.next_positions.expand(b, h, t)
        self.positions = new_pos.clone() if self.positions is None else torch.cat([self.positions, new_pos], dim=2)
        zeros = torch.zeros(b, h, t, dtype=torch.float32, device=key_states.device)
        self.state = {n: torch.cat([self.state[n], zeros], 2) if n in self.state else zeros.clone()
                      for n in self.state_names}
        self.pending = t
        self._held = self.nbytes()
        return keys, values

    def reserve(self, capacity: int) -> None:
        """Nothing to do: the gather store allocates what each step needs."""

    @property
    def lengths(self) -> list[int]:
        """Every row holds the same count (the engine's rows that share their positions)."""
        return [self.length] * (self.keys.shape[0] if self.is_initialized else 1)

    def view(self, m: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Every held token and the step's (the gather store holds nothing else)."""
        return self.keys, self.positions, self.state

    def keep_slots(self, kept: torch.Tensor | None, step) -> None:
        """Commit the step: gather the slots ``kept [b, h, m]`` (``None``: all) in slot order, which is position
        order here."""
        m = self.length + self.pending
        self.pending = 0
        if kept is None or bool(kept.all()):
            self.length = m
            return
        b, h = kept.shape[:2]
        keep = kept.nonzero()[:, -1].view(b, h, -1)  # row-major: ascending slots
        self.keys = self.keys.gather(2, expand_index(keep, self.keys))
        self.values = self.values.gather(2, expand_index(keep, self.values))
        self.positions = self.positions.gather(2, keep)
        self.state = {n: s.gather(2, keep) for n, s in self.state.items()}
        self.length = keep.shape[-1]


class GatherPoolLayer(HeadPoolLayer):
    """A head-shared pool whose eviction gathers the kept slots in (head, position) order into ``[0, K)``."""

    def commit(self, kept: torch.Tensor | None) -> None:
        if kept is None:
            return super().commit(None)
        m = self.filled()
        self.pending = 0
        k = kept.shape[1]
        for buf in self.buffers():
            rows = buf[:, 0, :m].gather(1, expand_index(kept.unsqueeze(1), buf[:, :, :m])[:, 0])
            buf[:, 0, :k] = rows
        self.length = k // self.heads


def gather_layer(capacity: int, state_names: tuple[str, ...], static_base: int | None, shares_heads: bool,
                 limit: int | None = None):
    """The gather store's layer (``Engine(cache_layer=...)``); it has no static layout (graph path), and grows
    to what each step holds (``limit`` does not apply)."""
    if static_base is not None:
        raise ValueError("cache_layer: the gather store has no static layout (run it without graphs)")
    return GatherPoolLayer(capacity) if shares_heads else GatherLayer(capacity, state_names)


class EmulatedGraphs(StepInputs):
    """A graph runner (``Engine(graph_runner=...)``) that runs the captured step's static inputs through a
    plain call each time: the graph path without CUDA graphs."""

    def run(self, step, cache, ids: torch.Tensor, seen: int) -> torch.Tensor:
        self.fill(ids, seen)
        return self.call(step, cache).clone()


#: ``Engine(..., **GATHER)``: the gather store
GATHER = {"cache_layer": gather_layer}
#: ``Engine(..., **EMULATED)``: the graph path emulated (with ``EngineConfig(cuda_graphs=True)``)
EMULATED = {"graph_runner": EmulatedGraphs}
#: the engine's store (``{}``: its slot layers) and the reference, by name, for tests parametrized over both
STORES = {"slot": {}, "gather": GATHER}
