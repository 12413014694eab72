"""What each decoder layer of a model attends to, read from its config: the layer's kind.

- ``full``: every earlier token. The policy evicts these layers to the budget ``N``.
- ``sliding`` (span ``W``): a query at position ``p`` sees keys at positions ``(p - W, p]`` (transformers'
  ``sliding_window``: Gemma 2/3, Cohere 2, GPT-OSS, OLMo 3, EXAONE 4, Mistral and Qwen with a window).
- ``chunked`` (span ``C``): a query sees the keys of its own attention chunk of ``C`` positions up to itself
  (Llama 4's ``chunked_attention`` layers).

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

FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"
#: transformers' ``config.layer_types`` names of the kinds the engine runs
_TYPE_NAMES = {"full_attention": FULL, "sliding_attention": SLIDING, "chunked_attention": CHUNKED}


@dataclass(frozen=True)
class LayerKind:
    """One layer's kind (module docstring); ``span``: the window ``W`` or the attention chunk ``C``."""

    kind: Literal["full", "sliding", "chunked"] = FULL
    span: int | None = None

    @property
    def windowed(self) -> bool:
        return self.kind != FULL

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
        return FULL if not self.windowed else f"{self.kind} {self.span}"


def _context(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def unknown_layer_types(config: Any) -> list[str]:
    """The ``config.layer_types`` names the engine does not run (linear attention, state-space layers, ...)."""
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
        kind = _TYPE_NAMES[name]
        span = window if kind == SLIDING else chunk if kind == CHUNKED else None
        if kind != FULL and (not span or (context and span >= context)):
            kind, span = FULL, None  # no window, or one the context never reaches: the layer sees everything
        out.append(LayerKind(kind, span))
    return tuple(out)


def describe(kinds: tuple[LayerKind, ...]) -> str:
    """``"18 layers: 3 full, 15 sliding 512"``: a model's layer kinds in words."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k.label()] = counts.get(k.label(), 0) + 1
    parts = [f"{c} {label}" for label, c in sorted(counts.items(), key=lambda kv: (kv[0] != FULL, kv[0]))]
    return f"{len(kinds)} layers: " + ", ".join(parts)
