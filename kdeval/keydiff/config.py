"""The chunked engine's settings and the one set of rules they are checked by.

:data:`RULES` is where every engine setting's allowed values are written: :class:`EngineConfig` checks itself by
them, and the grid (``kdeval.jobs.grid.load``, through ``kdeval.cluster.catalog``) turns the same messages into
errors at its own field paths (``chunk_sizes[1]``, ``engine.score_precision``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from kdeval.keydiff.quant.rule import KVQuant

SCORE_PRECISIONS = ("model", "float32")


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


#: Each setting's test of a value and what the message says when the value fails it (without the name).
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "budget": (lambda v: _count(v, 1), "must be a positive number of tokens"),
    "chunk_size": (lambda v: _count(v, 1), "must be a positive number of tokens"),
    "max_new_tokens": (lambda v: _count(v, 0), "must be an integer >= 0"),
    "cuda_graphs": (lambda v: v is None or isinstance(v, bool), "must be true, false or None (on with CUDA)"),
    "score_precision": (lambda v: v in SCORE_PRECISIONS, f"expected one of {list(SCORE_PRECISIONS)}"),
    "kv_quant": (lambda v: v is None or isinstance(v, KVQuant), "must be a KVQuant, its fields or None"),
}


def setting_error(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` for engine setting ``name`` (``"must be a positive number of tokens, got
    0"``, without the name), or ``None`` when it is allowed."""
    allowed, expected = RULES[name]
    return None if allowed(value) else f"{expected}, got {value!r}"


@dataclass(frozen=True)
class EngineConfig:
    """``budget`` N: tokens kept per layer per KV head (``None``: no eviction); ``chunk_size`` B."""

    budget: int | None = None
    chunk_size: int = 128
    max_new_tokens: int = 32
    #: capture the full-chunk step and the decode step as CUDA graphs (static slot layout); ``None``: on when
    #: the model is on CUDA (checked on an H200 by bench/gpu_check.py, see bench/RESULTS.md).
    cuda_graphs: bool | None = None
    #: precision of the attention logits captured for TOVA, SnapKV and H2O in a half-precision model: "model"
    #: (a half-precision product with float32 accumulation, then a float32 softmax, as in transformers'
    #: eager attention and kvpress) or "float32" (the keys copied to float32 first). No effect otherwise.
    score_precision: str = "model"
    #: store kept tokens quantized (kdeval/keydiff/quant/rule.py; a ``KVQuant`` or its fields as a dict); ``None``: at
    #: the model's width. Applies with or without eviction (the full cache in 4 bits is a configuration too).
    kv_quant: KVQuant | None = None

    def __post_init__(self) -> None:
        if isinstance(self.kv_quant, dict):
            try:
                object.__setattr__(self, "kv_quant", KVQuant.of(self.kv_quant))
            except ValueError as e:
                raise ValueError(f"kv_quant.{e}") from None
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "budget" and value is None:
                continue
            msg = setting_error(f.name, value)
            if msg is not None:
                raise ValueError(f"{f.name}: {msg}")
