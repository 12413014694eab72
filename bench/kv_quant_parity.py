"""kdeval's quantized store against transformers' ``QuantizedCache`` on SmolLM2-135M, without eviction.

kdeval: the full cache, one-shot prefill, ``per_token`` scheme, ``window: 0`` (every token quantized after the step
that writes it). transformers: ``QuantizedCache(backend, nbits, axis = each token's groups of channels,
q_group_size, residual_length=1)``, which also quantizes every token after its step (and re-quantizes the
whole cache from its dequantized values at every step). Reported: after the prompt, the share of dequantized
key/value numbers that are identical and the largest difference in steps of their group (every layer); then
the greedy tokens, and the first one that differs.

    python bench/kv_quant_parity.py [--new 12] [--group 64]
"""
from __future__ import annotations

import argparse
import importlib.util

import torch


def step_of(x: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    g = x.unflatten(-1, (x.shape[-1] // group, group))
    return ((g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / (2**bits - 1)).expand_as(g).flatten(-2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=12)
    ap.add_argument("--group", type=int, default=64)
    a = ap.parse_args()
    from transformers.cache_utils import QuantizedCache

    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    lm = load_model("smollm2-135m", device="cpu")
    m = lm.model
    ids = torch.tensor([lm.tokenizer("The history of the city begins with a small settlement on the river. " * 12).input_ids])
    ids = ids[:, : ids.shape[1] // 2 * 2]  # an even count: HQQ packs 4-bit codes in pairs of rows
    t = ids.shape[1]
    print(f"SmolLM2-135M float32, {t}-token prompt, {a.new} greedy tokens, groups of {a.group}, window 0 / "
          "residual_length 1")
    print("| backend | bits | identical K/V numbers after the prompt | max difference (steps of its group) | "
          "same greedy tokens | first differing token |")
    print("|---|---|---|---|---|---|")
    raw = Engine(m, get_policy("full"), EngineConfig(chunk_size=t)).prefill(ids)
    for backend, package, bits in (("quanto", "optimum.quanto", 4), ("quanto", "optimum.quanto", 2),
                                   ("hqq", "hqq", 4)):
        if importlib.util.find_spec(package.split(".")[0]) is None:
            print(f"| {backend} | {bits} | {package} not installed | | | |")
            continue
        axis = 0 if backend == "quanto" else 1
        quant = {"bits": bits, "group_size": a.group, "window": 0, "scheme": "per_token"}
        cache = QuantizedCache(backend, m.config, nbits=bits, axis_key=axis, axis_value=axis, q_group_size=a.group,
                               residual_length=1)
        with torch.no_grad():
            m(input_ids=ids, past_key_values=cache, use_cache=True)
        ours = Engine(m, get_policy("full"), EngineConfig(chunk_size=t, kv_quant=quant)).prefill(ids)
        same = total = 0
        worst = 0.0
        for theirs, mine, plain in zip(cache.layers, ours.cache.layers, raw.cache.layers):
            got = ((theirs._quantized_keys.dequantize(), theirs._quantized_values.dequantize()) if backend == "quanto"
                   else (theirs._dequantize(theirs._quantized_keys), theirs._dequantize(theirs._quantized_values)))
            for x, y, r in zip(got, (mine.keys[:, :, :t], mine.values[:, :, :t]), (plain.keys, plain.values)):
                same += int((x == y).sum())
                total += x.numel()
                worst = max(worst, float(((x - y).abs() / step_of(r, a.group, bits)).max()))
        cache = QuantizedCache(backend, m.config, nbits=bits, axis_key=axis, axis_value=axis, q_group_size=a.group,
                               residual_length=1)
        ref = m.generate(ids, past_key_values=cache, max_new_tokens=a.new, do_sample=False)[0, t:].tolist()
        got = Engine(m, get_policy("full"), EngineConfig(chunk_size=t, kv_quant=quant)).generate(ids, a.new).tokens[0]
        first = next((i for i, (x, y) in enumerate(zip(ref, got)) if x != y), None)
        print(f"| {backend} | {bits} | {100 * same / total:.2f}% | {worst:.3f} | {sum(x == y for x, y in zip(ref, got))}"
              f"/{a.new} | {'-' if first is None else first} |")


if __name__ == "__main__":
    main()
