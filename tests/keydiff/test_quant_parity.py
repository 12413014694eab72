"""Parity with transformers' quantized caches, without eviction: kdeval's ``per_token`` store with no window against
``QuantizedCache`` grouping channels of each token (quanto's ``axis 0``, HQQ's ``axis 1``) and ``residual_length=1`` (every token
quantized after the step that writes it: kdeval's ``window: 0``). The dequantized keys and values agree within one
quantization step of their group, and the greedy tokens are the same. Each backend's test skips where its package
is absent (bench/kv_quant_parity.py gives the same figures on SmolLM2)."""
from types import SimpleNamespace

import pytest
import torch

from kdeval.baselines import get_policy

from .helpers import make_engine, prompt, tiny


def quantized_cache(backend: str, config, bits: int, group: int):
    from transformers.cache_utils import QuantizedCache

    axis = 0 if backend == "quanto" else 1  # each token's groups of channels in either backend's terms
    return QuantizedCache(backend, config, nbits=bits, axis_key=axis, axis_value=axis, q_group_size=group,
                          residual_length=1)


def dequantized(backend: str, layer) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "quanto":
        return layer._quantized_keys.dequantize(), layer._quantized_values.dequantize()
    return layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values)


def group_step(x: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    """The quantization step of each element's group (``[..., d]``, groups of ``group`` channels)."""
    g = x.unflatten(-1, (x.shape[-1] // group, group))
    step = (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / (2**bits - 1)
    return step.expand_as(g).flatten(-2)


def check_parity(backend: str, bits: int, group: int, exact_share: float) -> None:
    lm = tiny("random:llama-tiny", 2, "float32")
    ids = prompt(40, seed=2)
    cache = quantized_cache(backend, lm.model.config, bits, group)
    with torch.no_grad():
        lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
    quant = {"bits": bits, "group_size": group, "window": 0, "scheme": "per_token"}
    ours = make_engine(lm.model, get_policy("full"), chunk_size=40, kv_quant=quant).prefill(ids)
    raw = make_engine(lm.model, get_policy("full"), chunk_size=40).prefill(ids)
    for theirs, mine, plain in zip(cache.layers, ours.cache.layers, raw.cache.layers):
        for t, m, r in zip(dequantized(backend, theirs), (mine.keys, mine.values), (plain.keys, plain.values)):
            step = group_step(r, group, bits)
            assert bool(((t - m).abs() <= step * 1.001 + 1e-6).all())  # within one step of the group
            assert float((t == m).float().mean()) >= exact_share
            assert float((m - r).pow(2).mean()) <= 1.15**2 * float((t - r).pow(2).mean())  # as close to the raw
            assert not torch.equal(m, r)  # quantized, not passed through
    cache = quantized_cache(backend, lm.model.config, bits, group)
    out = lm.model.generate(ids, past_key_values=cache, max_new_tokens=6, do_sample=False)
    mine = make_engine(lm.model, get_policy("full"), chunk_size=40, kv_quant=quant).generate(ids, 6)
    assert mine.tokens[0] == out[0, 40:].tolist()


def unpack_in_python(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """quanto's packing undone: byte ``j`` of ``packed [n, ...]`` holds the codes of rows ``j``, ``n + j``, ...
    in its successive ``bits``-bit fields, lowest first; the rows come back ``[n * 8 / bits, ...]``."""
    mask = 2**bits - 1
    return torch.cat([(packed >> (bits * i)) & mask for i in range(8 // bits)]).to(torch.uint8)


def quanto_without_compiling(monkeypatch) -> None:
    """Unpack quanto's codes in Python instead of its C++ kernel, which is compiled on first use (about 40 s in a
    fresh virtualenv); a wrong unpacking would give other dequantized values and fail the comparison."""
    from optimum.quanto.library.extensions.cpp import ext

    monkeypatch.setattr(ext, "_lib", SimpleNamespace(unpack=unpack_in_python))


@pytest.mark.parametrize("bits", [4, 2])
def test_quanto_gives_the_same_codes(bits, monkeypatch):
    pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed (pip install optimum-quanto)")
    quanto_without_compiling(monkeypatch)
    check_parity("quanto", bits, 8, exact_share=0.99)  # the same min/max rule: equal but for float rounding


def test_hqq_within_one_step():
    pytest.importorskip("hqq", reason="hqq is not installed (pip install hqq)")
    check_parity("hqq", 4, 16, exact_share=0.0)  # HQQ optimizes its zero points: within a step, not equal
