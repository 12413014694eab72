"""Memory figures: a run's peak (CUDA peak allocated on GPU, peak resident set size sampled on CPU; both include
the weights) and the bytes of a model's weights. The KV cache's own bytes are the cache's
(``BudgetCache.nbytes`` / ``held_nbytes``)."""
from __future__ import annotations

import os

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def model_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (each tensor once: tied weights are not counted twice)."""
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class PeakMemory:
    """Tracks the peak over a run. On CUDA the allocator's own peak is reset at start; on CPU RSS is sampled.

    ``kind`` names what the peak measures: ``"cuda_max_allocated"`` or ``"process_rss"`` (weights included
    either way)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.kind = "cuda_max_allocated" if self.cuda else "process_rss"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self.device = device
        self._peak = 0
        self.sample()

    def sample(self) -> None:
        if not self.cuda:
            self._peak = max(self._peak, current_rss_bytes())

    @property
    def peak_bytes(self) -> int:
        if self.cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        return self._peak
