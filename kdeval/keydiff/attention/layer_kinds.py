"""What each decoder layer of a model attends to, read from its config: the layer's kind.

- ``full``: every earlier token. The policy evicts these layers to the budget ``N``.
- ``sliding`` (span ``W``): a query at position ``p`` sees keys at positions ``(p - W, p]`` (transformers'
  ``sliding_window``: Gemma 2/3, Cohere 2, GPT-OSS, OLMo 3, EXAONE 4, Mistral and Qwen with a window).
- ``chunked`` (span ``C``): a query sees the keys of its own attention chunk of ``C`` positions up to itself
  (Llama 4's ``chunked_attention`` layers).
- ``state``: no per-token keys at all. A recurrent layer (``linear_attention``: GatedDeltaNet, KDA, Mamba/Mamba2;
  ``conv``: LFM2's short convolution) caches a conv and a recurrent state, constant in length; an ``mlp`` or
  ``moe`` block (Nemotron-H) caches nothing. The engine keeps the state whole and never shows it to a policy.

A layer may read another layer's keys instead of caching its own (``reads_layer``: Gemma 3n's and Gemma 4's last
``num_kv_shared_layers`` layers read the last earlier layer of their kind and never write the cache): it sees
exactly its source's kept set, holds nothing, and its budget and bytes are its source's.

A layer of attention may also hold a state beside its keys (``holds_state``: transformers' ``hybrid`` layers,
attention and Mamba side by side: Falcon-H1, Zamba2): its keys are evicted as its attention kind says, its state is
kept whole.

A windowed layer (sliding or chunked) keeps exactly what the next query can see, never more and never chosen by
the policy: after a step that leaves ``seen`` tokens processed, the positions from :meth:`LayerKind.first_kept`
on (``W - 1`` tokens at most for a sliding layer, ``C - 1`` for a chunked one; ``+ B`` while a chunk of ``B`` is
in flight). A window at least as long as the model's context never hides a token: such a layer is full.

This module imports torch only: grids are validated without transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

FULL, SLIDING, CHUNKED, STATE = "full", "sliding", "chunked", "state"
#: transformers' ``config.layer_types`` names of the kinds the engine runs: (kind, holds a state beside it)
_TYPE_NAMES = {"full_attention": (FULL, False), "sliding_attention": (SLIDING, False),
               "chunked_attention": (CHUNKED, False), "linear_attention": (STATE, True), "conv": (STATE, True),
               "mlp": (STATE, False), "moe": (STATE, False), "hybrid": (FULL, True),
               "hybrid_sliding": (SLIDING, True),
               # the names a checkpoint's config.json may still carry, which transformers' configs rename
               "mamba": (STATE, True), "attention": (FULL, False)}


@dataclass(frozen=True)
class LayerKind:
    """One layer's kind (module docstring); ``span``: the window ``W`` or the attention chunk ``C``."""

    kind: Literal["full", "sliding", "chunked", "state"] = FULL
    span: int | None = None
    #: the layer's cache holds a recurrent or conv state (a ``state`` layer's, or beside a hybrid layer's keys)
    holds_state: bool = False
    #: the earlier layer whose keys and values this one reads (KV sharing); ``None``: its own
    reads_layer: int | None = None

    @property
    def windowed(self) -> bool:
        return self.kind in (SLIDING, CHUNKED)

    @property
    def attends(self) -> bool:
        """The layer caches per-token keys and values of its own (every kind but ``state``, and not a layer that
        reads another's)."""
        return self.kind != STATE and self.reads_layer is None

    @property
    def evicted(self) -> bool:
        """A full-attention layer with keys of its own: the one kind the policy evicts, to its budget."""
        return self.kind == FULL and self.reads_layer is None

    def most_kept(self) -> int:
        """The most tokens a windowed layer holds between steps (per row and KV head)."""
        if not self.windowed:
            raise ValueError("most_kept: a full-attention layer keeps what the policy keeps")
        return self.span - 1

    def first_kept(self, seen: Any) -> Any:
        """The oldest position the next query (at position ``seen``) can see; ``seen`` an int or a tensor."""
        if self.kind == SLIDING:
            return seen - self.span + 1
        return (seen // self.span) * self.span

    def kept_count(self, seen: int) -> int:
        """Tokens a windowed layer holds after ``seen`` tokens were processed."""
        return seen - max(self.first_kept(seen), 0)

    def visible(self, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        """Whether a query at ``query_pos`` sees a key at ``key_pos`` beyond causality (broadcasting tensors)."""
        if self.kind == SLIDING:
            return key_pos > query_pos - self.span
        if self.kind == CHUNKED:
            return torch.div(key_pos, self.span, rounding_mode="floor") == torch.div(query_pos, self.span,
                                                                                       rounding_mode="floor")
        return torch.ones_like(key_pos > query_pos)

    def label(self) -> str:
        if self.reads_layer is not None:
            return "shared KV"
        if self.kind == STATE:
            return "recurrent" if self.holds_state else "no cache"
        base = FULL if not self.windowed else f"{self.kind} {self.span}"
        return f"{base} + recurrent" if self.holds_state else base


def decoder_config(config: Any) -> Any:
    """The config of a model's text decoder: ``config`` itself, or a multimodal wrapper's ``text_config`` (Qwen3.5,
    Gemma 3/4 and Mistral 3 checkpoints are saved as wrappers; their layers, heads and windows are the decoder's)."""
    if getattr(config, "text_config", None) is not None and callable(getattr(config, "get_text_config", None)):
        return config.get_text_config(decoder=True)
    return config


def _context(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def unknown_layer_types(config: Any) -> list[str]:
    """The ``config.layer_types`` names the engine does not run (sparse-attention indexers, ...)."""
    types = getattr(config, "layer_types", None) or []
    return sorted({t for t in types if t not in _TYPE_NAMES})


def layer_kinds(config: Any) -> tuple[LayerKind, ...]:
    """Each decoder layer's :class:`LayerKind` from ``config``: its ``layer_types`` when it has them; else every
    layer sliding when ``sliding_window`` is set (and ``use_sliding_window`` not off: Mistral's default).
    ``ValueError`` for a layer type the engine does not run (:func:`unknown_layer_types`)."""
    n = int(config.num_hidden_layers)
    context = _context(config)
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", True):
        window = None
    chunk = getattr(config, "attention_chunk_size", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        types = ["sliding_attention" if window else "full_attention"] * n
    unknown = unknown_layer_types(config)
    if unknown:
        raise ValueError(f"layer_types: {unknown} are not attention layers the engine evicts from")
    if len(types) != n:
        raise ValueError(f"layer_types: {len(types)} entries for {n} layers")
    out = []
    for name in types:
        kind, state = _TYPE_NAMES[name]
        span = window if kind == SLIDING else chunk if kind == CHUNKED else None
        if kind in (SLIDING, CHUNKED) and (not span or (context and span >= context)):
            kind, span = FULL, None  # no window, or one the context never reaches: the layer sees everything
        out.append(LayerKind(kind, span, state))
    shared = int(getattr(config, "num_kv_shared_layers", 0) or 0)
    if 0 < shared < n:  # the last layers read the last earlier layer of their type (transformers' Gemma 3n/4)
        first = n - shared
        for idx in range(first, n):
            source = max(i for i in range(first) if types[i] == types[idx])
            out[idx] = LayerKind(out[idx].kind, out[idx].span, out[idx].holds_state, source)
    return tuple(out)


def describe(kinds: tuple[LayerKind, ...]) -> str:
    """``"18 layers: 3 full, 15 sliding 512"``: a model's layer kinds in words."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k.label()] = counts.get(k.label(), 0) + 1
    parts = [f"{c} {label}" for label, c in sorted(counts.items(), key=lambda kv: (not kv[0].startswith(FULL), kv[0]))]
    return f"{len(kinds)} layers: " + ", ".join(parts)
