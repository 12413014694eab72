"""Helpers shared by the engine tests: tiny models, kept positions, a reference one-pass forward."""
from __future__ import annotations

import functools

import torch

from kdeval.keydiff.models import LoadedModel, load_model


@functools.lru_cache(maxsize=None)
def tiny(name: str = "random:llama-tiny", kv_heads: int | None = None, dtype: str = "float32") -> LoadedModel:
    overrides = {"num_key_value_heads": kv_heads} if kv_heads else None
    return load_model(name, device="cpu", overrides=overrides, dtype=dtype)


def prompt(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, n), generator=g)


def kept_positions(state) -> list[torch.Tensor]:
    """Per layer, the sorted absolute positions held: ``[batch, kv_heads, tokens]``."""
    return [layer.view()[1].sort(dim=-1).values.clone() for layer in state.cache.layers]
