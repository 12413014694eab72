"""Helpers shared by the engine tests: tiny models, kept positions, a reference one-pass forward."""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch

from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.engine import Engine
from kdeval.zoo.loading import LoadedModel, load_model
from kdeval.keydiff.attention.reads import layer_projections


@functools.lru_cache(maxsize=None)
def tiny(name: str = "random:llama-tiny", kv_heads: int | None = None, dtype: str = "float32") -> LoadedModel:
    overrides = {"num_key_value_heads": kv_heads} if kv_heads else None
    return load_model(name, device="cpu", overrides=overrides, dtype=dtype)


HOOKS = ("cache_layer", "graph_runner")


def make_engine(model, policy, on_step=None, on_batch_step=None, **settings) -> Engine:
    """An engine from flat keywords, for tests that list engines as dicts: ``EngineConfig`` settings and the
    engine's test hooks (``cache_layer``, ``graph_runner``: tests/keydiff/oracles.py), e.g.
    ``make_engine(m, p, budget=40, cuda_graphs=True, **EMULATED)``."""
    hooks = {k: settings.pop(k) for k in HOOKS if k in settings}
    return Engine(model, policy, EngineConfig(**settings), on_step, on_batch_step, **hooks)


def prompt(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, n), generator=g)


def kept_positions(state) -> list[torch.Tensor]:
    """Per layer that caches keys, the sorted absolute positions held: ``[batch, kv_heads, tokens]`` (a recurrent
    layer's states hold none)."""
    layers = getattr(state.cache, "kv_layers", state.cache.layers)
    return [layer.view()[1].sort(dim=-1).values.clone() for layer in layers]


def assert_same_run(got, ref, atol: float | None = None, rtol: float = 1e-5) -> None:
    """Two ``GenerationResult``s agree: the same generated tokens, the same kept positions in every layer and,
    with ``atol``, last prompt logits within ``torch.allclose(rtol, atol)``."""
    assert got.tokens == ref.tokens
    for a, b in zip(kept_positions(got.state), kept_positions(ref.state)):
        assert torch.equal(a, b)
    if atol is not None:
        assert torch.allclose(got.state.last_logits, ref.state.last_logits, rtol=rtol, atol=atol)


def reference_attention(q, k, v, mask, scale):
    """Softmax attention with every KV head repeated for its query heads: ``[b, t, hq, d]``."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    logits = (q @ k.transpose(-1, -2)) * scale
    probs = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    return (probs @ v).transpose(1, 2), probs


def assert_ragged_batch_matches_alone(policy) -> None:
    """``generate_batch`` over prompts of other lengths (padded, each with its own ``seen``) equals each prompt
    run alone, for ``policy`` at N=24, B=16 on a float64 tiny model."""
    import torch

    from kdeval.keydiff import Engine, EngineConfig

    lm = tiny("random:llama-tiny", 2, "float64")
    eng = Engine(lm.model, policy, EngineConfig(budget=24, chunk_size=16))
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (37, 70, 5)]
    for ids, got in zip(ps, eng.generate_batch(ps, max_new_tokens=8)):
        assert_same_run(got, eng.generate(ids.unsqueeze(0), max_new_tokens=8))


@contextlib.contextmanager
def capture_hidden_states(model: torch.nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """While open, every forward of ``model`` stores each layer's attention input (``q_proj``'s input,
    ``[batch, t, hidden]``) in the yielded dict, by layer."""
    out: dict[int, torch.Tensor] = {}
    hooks = []

    def hook(idx: int):
        def store(module, args):
            out[idx] = args[0]
        return store

    try:
        for idx, proj in enumerate(p.q_proj for p in layer_projections(model)):
            hooks.append(proj.register_forward_pre_hook(hook(idx)))
        yield out
    finally:
        for h in hooks:
            h.remove()
