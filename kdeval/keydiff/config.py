"""The chunked engine's settings: budget, chunk size, KV store, and the graph path's options."""
from __future__ import annotations

from dataclasses import dataclass

STORES = ("slot", "gather")
SCORE_PRECISIONS = ("model", "float32")


@dataclass(frozen=True)
class EngineConfig:
    """``budget`` N: tokens kept per layer per KV head (``None``: no eviction); ``chunk_size`` B."""

    budget: int | None = None
    chunk_size: int = 128
    max_new_tokens: int = 32
    store: str = "slot"
    #: capture the full-chunk step and the decode step as CUDA graphs (static slot layout); ``None``: on when
    #: the model is on CUDA (checked on an H200 by bench/gpu_check.py, see bench/RESULTS.md).
    #: ``emulate_graphs`` runs the same static-layout step with plain calls instead of graph replays (tests
    #: without CUDA; on CUDA, the eager reference the captured graphs are checked against).
    cuda_graphs: bool | None = None
    emulate_graphs: bool = False
    #: Experimental GPU speed options (fuse_layers, compile_scoring, compile_blocks, attention_splits,
    #: flex_attention): used by bench/ only, not user options (bench/README.md), until a GPU run decides them.
    #: with graphs: score and evict all layers at once (one batch of ``layers * batch`` rows over shared
    #: buffers) instead of layer by layer: ~28x fewer, larger kernels per step. Off until measured on a GPU.
    fuse_layers: bool = False
    #: with graphs: run the policy's scoring through ``torch.compile`` (on CUDA, inductor's fused kernels: the
    #: keys read in a couple of passes, no float32 copy of them, no cuBLAS matrix-vector products). The graph
    #: path's shapes are fixed, so it compiles once per policy class and shape. Off until measured on a GPU.
    compile_scoring: bool = False
    #: precision of the attention logits captured for TOVA, SnapKV and H2O in a half-precision model: "model"
    #: (a half-precision product with float32 accumulation, then a float32 softmax, as in transformers'
    #: eager attention and kvpress) or "float32" (the keys copied to float32 first). No effect otherwise.
    score_precision: str = "model"
    #: with graphs: compile the decoder layers' cache-free blocks (RMSNorms, MLP, rotary embedding) with
    #: ``torch.compile`` (kdeval/keydiff/blocks.py): fewer, fused kernels per step. Off until measured on a GPU.
    compile_blocks: bool = False
    #: with graphs, once the head is full: attend to it in this many splits of the keys, merged by their
    #: log-sum-exps (kdeval/keydiff/split_attention.py), for more parallel work than one small chunk gives a
    #: fused kernel; 0: one SDPA call. It must divide the budget; batches of more than one row run SDPA. Off
    #: until measured on a GPU.
    attention_splits: int = 0
    #: with graphs: compute the static layout's attention for full chunks and decode steps with FlexAttention
    #: (compiled; kdeval/keydiff/flex_static.py), which skips the empty head slots while the head fills
    #: instead of masking them. Exclusive with ``attention_splits``. Off until measured on a GPU.
    flex_attention: bool = False

    def __post_init__(self) -> None:
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget <= 0):
            raise ValueError(f"budget: must be a positive number of tokens (or None for no eviction), got {self.budget!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size <= 0:
            raise ValueError(f"chunk_size: must be a positive number of tokens, got {self.chunk_size!r}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {self.max_new_tokens}")
        if self.store not in STORES:
            raise ValueError(f"store: expected one of {list(STORES)}, got {self.store!r}")
        if not isinstance(self.attention_splits, int) or self.attention_splits < 0:
            raise ValueError(f"attention_splits: must be an integer >= 0, got {self.attention_splits!r}")
        if self.attention_splits and self.budget is not None and self.budget % self.attention_splits:
            raise ValueError(f"attention_splits: must divide the budget ({self.budget} tokens) into equal splits, "
                             f"got {self.attention_splits}")
        if self.flex_attention and self.attention_splits:
            raise ValueError("flex_attention: FlexAttention replaces attention_splits; set one of them, not both")
        if self.score_precision not in SCORE_PRECISIONS:
            raise ValueError(f"score_precision: expected one of {list(SCORE_PRECISIONS)}, "
                             f"got {self.score_precision!r}")
