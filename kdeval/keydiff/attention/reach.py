"""Whether a model's attention reaches the engine's attention functions, with the forward's keywords.

The engine runs a model's attention under its own functions (registered with transformers' ``AttentionInterface``)
and hands them what a step needs as forward keywords (``kdeval_capture``: the attention rows a policy reads;
``kdeval_layer_masks``: per-layer and windowed masks; ``kdeval_pool``). Some transformers models call those
functions but drop the forward's keywords on the way (StableLM's and Nemotron's decoder layers call ``self_attn``
without ``**kwargs``). The config does not say so: one one-token forward under a probe function tells, when an
engine whose policy needs those keywords is built, before any step.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kdeval.keydiff.attention.functions import attention_implementation
from kdeval.keydiff.attention.layer_kinds import STATE, decoder_config, layer_kinds

PROBE_IMPL = "kdeval_probe"


@dataclass(frozen=True)
class Reach:
    """Of a model's ``layers`` of attention: those whose attention ran the engine's function (``called``) and those that got the
    forward's keywords there too (``keyed``)."""

    layers: frozenset[int]
    called: frozenset[int]
    keyed: frozenset[int]

    @property
    def attention_runs_ours(self) -> bool:
        return len(self.called) >= len(self.layers)

    @property
    def layers_named(self) -> bool:
        """Each attention module carries its own decoder layer's index (not so a block shared across layers,
        Zamba2's, whose ``layer_idx`` is -1): what the engine captures per layer is that layer's."""
        return self.called == self.layers

    @property
    def keywords_arrive(self) -> bool:
        return len(self.keyed) >= len(self.layers)


_TOKEN = object()


def _probe(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    reach = kwargs.pop("kdeval_probe", None)
    seen = _seen.get(id(module))
    if seen is not None:
        seen[0].add(module.layer_idx)
        if reach is _TOKEN:
            seen[1].add(module.layer_idx)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


_seen: dict[int, tuple[set[int], set[int]]] = {}
AttentionInterface.register(PROBE_IMPL, _probe)
AttentionMaskInterface.register(PROBE_IMPL, sdpa_mask)


_known: "weakref.WeakKeyDictionary[torch.nn.Module, Reach]" = weakref.WeakKeyDictionary()


def attention_reach(model: torch.nn.Module) -> Reach:
    """What :func:`probe_reach` finds for ``model``, probed once per model (every cell's engine reads it)."""
    if model not in _known:
        _known[model] = probe_reach(model)
    return _known[model]


@torch.inference_mode()
def probe_reach(model: torch.nn.Module) -> Reach:
    """One token through ``model`` under a probe attention function that records which layers call it and with which
    keywords (module docstring)."""
    called: set[int] = set()
    keyed: set[int] = set()
    modules = [m for m in model.modules() if hasattr(m, "layer_idx")]
    for m in modules:
        _seen[id(m)] = (called, keyed)
    try:
        ids = torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)
        with attention_implementation(model, PROBE_IMPL):
            model(input_ids=ids, use_cache=False, kdeval_probe=_TOKEN)
    finally:
        for m in modules:
            _seen.pop(id(m), None)
    # every layer but a recurrent one runs attention (one that reads another layer's keys too)
    attending = frozenset(i for i, k in enumerate(layer_kinds(decoder_config(model.config))) if k.kind != STATE)
    return Reach(attending, frozenset(called), frozenset(keyed))
