"""Memory figures: a run's peak (CUDA peak allocated on GPU, peak resident set size sampled on CPU; both include
the weights), the bytes of a model's weights, and a request's own KV bytes: the tokens it holds under its policy
at each layer's bytes per token (:func:`own_peak_bytes`, :func:`own_kept_bytes`), the same alone, batched or in a
group; the buffers allocated for it (a batch's padding and rows, slots allocated ahead) are the cache's
(``BudgetCache.nbytes`` / ``held_nbytes``), reported apart as ``kv_buffer_bytes``."""
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


def token_bytes(layers) -> list[int]:
    """Bytes of one token of one row in each of ``layers`` (slot-buffer layers: ``keys [rows, heads, slots,
    key_dim]``, ``values [rows, heads, slots, value_dim]``): its key and value over the layer's KV heads; 0 for a
    layer not allocated yet."""
    out = []
    for layer in layers:
        buffers = getattr(layer, "slot_buffers", None)  # a plain transformers layer: its keys and values
        t = buffers.tensors if buffers is not None else {"keys": getattr(layer, "keys", None),
                                                         "values": getattr(layer, "values", None)}
        # a head pool (AdaKV) keeps every KV head's slots along one axis ([rows, 1, H * slots, dim]) and counts
        # its length per head: a token there is H slots
        heads = getattr(layer, "heads", 1) if hasattr(layer, "head_capacity") else None
        out.append(sum((heads or t[n].shape[1]) * t[n].shape[3] * t[n].element_size() for n in ("keys", "values")
                       if isinstance(t.get(n), torch.Tensor) and t[n].dim() == 4))
    return out


def layer_lengths(cache) -> list[int]:
    """Tokens each layer of a batch-1 ``BudgetCache`` holds (its fullest head's count)."""
    return [int(layer.length) for layer in cache.layers]


def own_bytes(layers, lengths, extra: int = 0) -> int:
    """Bytes of K/V a request holds by its own tokens: ``lengths[l] + extra`` tokens in each of ``layers`` at
    that layer's :func:`token_bytes` (what it holds under its policy, whatever buffers were allocated around
    it: a batch's padding, slots allocated ahead, another row's tokens)."""
    return sum((n + extra) * b for n, b in zip(lengths, token_bytes(layers)))


def own_peak_bytes(cache, before: list[int], t: int) -> int:
    """What a batch-1 ``BudgetCache`` held by its request's own tokens during a forward of ``t`` tokens, each
    layer holding ``before[l]`` (:func:`layer_lengths` before the forward) plus the chunk; a quantized store's
    own held bytes (its record plus the chunk in full precision, ``held_nbytes``)."""
    if cache.kv_store is not None:
        return cache.held_nbytes()
    return own_bytes(cache.layers, before, t)


def own_kept_bytes(cache) -> int:
    """What a batch-1 ``BudgetCache`` holds by its request's own tokens now (a quantized store's ``nbytes``)."""
    if cache.kv_store is not None:
        return cache.nbytes()
    return own_bytes(cache.layers, layer_lengths(cache))
