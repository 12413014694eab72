"""What a quantized KV store costs, side by side with the 16-bit cache, in one run.

Two measurements, interleaved (every repeat runs each configuration once, in turn):

1. **The store's own work, per chunk and per decoded token**, on SmolLM2-135M's cache shape (30 layers, 3 KV
   heads, head_dim 64) at N + B slots: what a store holding codes does beyond what the 16-bit cache does. The
   16-bit cache writes the step's tokens into its buffer; a codes store also quantizes the tokens that leave
   the window (a chunk's B, or one per decoded token) and dequantizes the whole cache for the step's attention.
   Timed with the engine's own rule (kdeval/keydiff/quant/rule.py).
2. **The engine end to end**: KeyDiff on SmolLM2, a chunked prompt then greedy decoding, with kept tokens at the
   model's width and under a 4-bit store of each scheme (what kdeval runs: quantize-on-leave into the working
   buffers, kdeval/keydiff/quant/store.py).

    python bench/kv_quant_cost.py [--tokens 1024] [--budget 256] [--chunk 128] [--new 16] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kdeval.keydiff.quant.rule import dequantize, quantize

LAYERS, HEADS, DIM = 30, 3, 64


def per_channel_codes(x: torch.Tensor, group: int, bits: int):
    """KIVI's keys of ``x [1, h, t, d]`` (t a multiple of ``group``): codes, scale, zero per (head, group, channel)."""
    g = x.unflatten(2, (x.shape[2] // group, group))
    return quantize(g, g.amin(3, keepdim=True), g.amax(3, keepdim=True), bits)


def per_token_codes(x: torch.Tensor, group: int, bits: int):
    g = x.unflatten(-1, (x.shape[-1] // group, group))
    return quantize(g, g.amin(-1, keepdim=True), g.amax(-1, keepdim=True), bits)


def store_step(scheme: str | None, cache: list, codes: list, new: torch.Tensor, group: int, bits: int) -> None:
    """One step of every layer: write ``new [1, h, t, d]`` keys and values (the 16-bit cache's whole work); a codes
    store also quantizes them and dequantizes its held codes (keys and values) for the step's attention. KIVI's
    keys of a decoded token wait in the window until a group is whole (:func:`time_store` adds that share)."""
    t = new.shape[2]
    for layer, held in zip(cache, codes):
        layer[:, :, -t:] = new  # keys
        layer[:, :, -t:] = new  # values
        if scheme is None:
            continue
        if scheme == "kivi" and t >= group:
            per_channel_codes(new, group, bits)
        elif scheme != "kivi":
            per_token_codes(new, group, bits)
        per_token_codes(new, group, bits)  # values: per token in both schemes
        dequantize(*held)
        dequantize(*held)


def time_store(scheme, slots: int, t: int, group: int, bits: int, steps: int = 3) -> float:
    """Seconds of one step (all layers) at ``slots`` held slots and ``t`` new tokens."""
    cache = [torch.randn(1, HEADS, slots, DIM) for _ in range(LAYERS)]
    codes = [per_token_codes(c, group, bits) for c in cache]
    new = torch.randn(1, HEADS, t, DIM)
    store_step(scheme, cache, codes, new, group, bits)  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        store_step(scheme, cache, codes, new, group, bits)
    out = (time.perf_counter() - start) / steps
    if scheme == "kivi" and t < group:  # one key group of ``group`` decoded tokens quantized every ``group`` steps
        block = torch.randn(1, HEADS, group, DIM)
        start = time.perf_counter()
        for _ in range(LAYERS):
            per_channel_codes(block, group, bits)
        out += (time.perf_counter() - start) / group
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    lm = load_model("smollm2-135m", device="cpu")
    ids = torch.tensor([lm.tokenizer("The city was founded on the river bank. " * (a.tokens // 8)).input_ids[: a.tokens]])
    stores = {"16-bit": None, "kivi 4-bit": "kivi", "per_token 4-bit": "per_token"}
    quant = {"kivi": {"bits": 4, "group_size": 32, "window": 32, "scheme": "kivi"},
             "per_token": {"bits": 4, "group_size": 32, "window": 32, "scheme": "per_token"}}
    chunk_s, token_s, run_s, tokens = ({k: [] for k in stores} for _ in range(4))
    for _ in range(a.repeats):
        for name, scheme in stores.items():
            chunk_s[name].append(time_store(scheme, a.budget + a.chunk, a.chunk, 32, 4))
            token_s[name].append(time_store(scheme, a.budget + 1, 1, 32, 4))
            eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=a.budget, chunk_size=a.chunk,
                                                                         kv_quant=quant.get(scheme)))
            start = time.perf_counter()
            res = eng.generate(ids, max_new_tokens=a.new)
            run_s[name].append(time.perf_counter() - start)
            tokens[name] = (res.tokens[0], res.stats.peak_kv_bytes)
    med = {k: {m: statistics.median(v[k]) for m, v in (("chunk", chunk_s), ("token", token_s), ("run", run_s))}
           for k in stores}
    print(f"SmolLM2-135M cache shape ({LAYERS} layers x {HEADS} KV heads x {DIM}), float32, 1 thread, "
          f"N={a.budget}, B={a.chunk}, {a.tokens}-token prompt, {a.new} new tokens; medians of {a.repeats}")
    print("| store | store work per chunk ms | per decoded token ms | KeyDiff run s | ratio | peak KV MiB | tokens = 16-bit |")
    print("|---|---|---|---|---|---|---|")
    base = med["16-bit"]["run"]
    for k in stores:
        m = med[k]
        print(f"| {k} | {m['chunk'] * 1e3:.2f} | {m['token'] * 1e3:.3f} | {m['run']:.2f} | {m['run'] / base:.2f}x | "
              f"{tokens[k][1] / 2**20:.2f} | {tokens[k][0] == tokens['16-bit'][0]} |")


if __name__ == "__main__":
    main()
