"""The chunked engine's settings and the one set of rules they are checked by, and the experimental GPU speed
options that only ``bench/`` switches on.

:data:`RULES` is where every engine setting's allowed values are written: :class:`EngineConfig` checks itself by
them, and the grid (``kdeval.jobs.validate``, through ``kdeval.cluster.catalog``) turns the same messages into
errors at its own field paths (``chunk_sizes[1]``, ``engine.score_precision``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "budget" and value is None:
                continue
            msg = setting_error(f.name, value)
            if msg is not None:
                raise ValueError(f"{f.name}: {msg}")


@dataclass(frozen=True)
class Experimental:
    """GPU speed ideas for the CUDA graph path, given to the engine by ``bench/`` only (``Engine(...,
    experimental=...)``, bench/README.md): none has been timed on a GPU, so none is a user option (grids,
    ``kdeval generate`` and cell identity do not know them). Each applies with graphs only and keeps what the
    reference store keeps (tests)."""

    #: score and evict all layers at once (one batch of ``layers * batch`` rows over shared buffers) instead of
    #: layer by layer: ~28x fewer, larger kernels per step.
    fuse_layers: bool = False
    #: run the policy's scoring through ``torch.compile`` (on CUDA, inductor's fused kernels: the keys read in
    #: a couple of passes, no float32 copy of them, no cuBLAS matrix-vector products). The graph path's shapes
    #: are fixed, so it compiles once per policy class and shape.
    compile_scoring: bool = False
    #: compile the decoder layers' cache-free blocks (RMSNorms, MLP, rotary embedding) with ``torch.compile``
    #: (kdeval/keydiff/blocks.py): fewer, fused kernels per step.
    compile_blocks: bool = False
    #: once the head is full, attend to it in this many splits of the keys, merged by their log-sum-exps
    #: (kdeval/keydiff/split_attention.py), for more parallel work than one small chunk gives a fused kernel;
    #: 0: one SDPA call. It must divide the budget; batches of more than one row run SDPA.
    attention_splits: int = 0
    #: compute the static layout's attention for full chunks and decode steps with FlexAttention (compiled;
    #: kdeval/keydiff/flex_static.py), which skips the empty head slots while the head fills instead of masking
    #: them. Exclusive with ``attention_splits``.
    flex_attention: bool = False

    def __post_init__(self) -> None:
        if not _count(self.attention_splits, 0):
            raise ValueError(f"attention_splits: must be an integer >= 0, got {self.attention_splits!r}")
        if self.flex_attention and self.attention_splits:
            raise ValueError("flex_attention: FlexAttention replaces attention_splits; set one of them, not both")

    def check(self, budget: int | None, device: torch.device, dtype: torch.dtype) -> None:
        """Refuse options that the engine's ``budget`` or its model (on ``device``, in ``dtype``) cannot take."""
        if self.attention_splits and budget is not None and budget % self.attention_splits:
            raise ValueError(f"attention_splits: must divide the budget ({budget} tokens) into equal splits, "
                             f"got {self.attention_splits}")
        if self.flex_attention and device.type == "cpu" and dtype == torch.float64:
            raise ValueError("flex_attention: FlexAttention on a CPU takes float32, float16 or bfloat16 models; "
                             "this one is float64")
