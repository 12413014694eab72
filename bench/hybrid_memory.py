"""Peak KV bytes of a hybrid model against prompt length: chunked KeyDiff (N per full-attention layer) beside the
model's own one-pass prefill, with the windowed layers' share.

The model has Gemma-3-270M's attention shape (18 layers, 5 sliding : 1 full, a 512-token window, 1 KV head of 256
channels; random weights and a small hidden size: KV bytes depend only on the attention shape). One pass is
transformers' own prefill into its ``DynamicCache`` (full layers hold every token, sliding ones their window);
past ``--one-pass-max`` tokens its bytes are computed from that rule instead of measured (its masks would not
fit this machine) and labelled so.

    python bench/hybrid_memory.py [--lengths 4096,16384,65536] [--budget 1024] [--chunk 128]
"""
from __future__ import annotations

import argparse

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.attention.layer_kinds import layer_kinds

MiB = 2**20


def model(context: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gemma3_text", vocab_size=512, hidden_size=64, intermediate_size=64,
                               num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                               sliding_window=512, max_position_embeddings=context)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def one_pass_bytes(m: torch.nn.Module, ids: torch.Tensor) -> int:
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(ids, past_key_values=cache, use_cache=True)
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def one_pass_rule(m: torch.nn.Module, length: int) -> int:
    per_token = 2 * m.config.num_key_value_heads * m.config.head_dim * 4
    return sum(per_token * (min(length, k.most_kept()) if k.windowed else length) for k in layer_kinds(m.config))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--one-pass-max", type=int, default=16384)
    args = ap.parse_args()
    torch.set_num_threads(2)
    lengths = [int(x) for x in args.lengths.split(",")]
    m = model(max(lengths) + 16)
    print("| L | mode | peak KV MiB | KV MiB held at the end | of which windowed layers | policy-controlled share |")
    print("|---|---|---|---|---|---|")
    for length in lengths:
        ids = torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(length))
        if length <= args.one_pass_max:
            full = one_pass_bytes(m, ids)
            assert full == one_pass_rule(m, length), (full, one_pass_rule(m, length))
            label = "one pass (DynamicCache, measured)"
        else:
            full, label = one_pass_rule(m, length), "one pass (DynamicCache's rule, computed)"
        win = sum(2 * m.config.head_dim * 4 * k.most_kept()
                                                    for k in layer_kinds(m.config) if k.windowed)
        print(f"| {length} | {label} | {full / MiB:.1f} | {full / MiB:.1f} | {win / MiB:.1f} | {1 - win / full:.0%} |")
        res = Engine(m, get_policy("keydiff"), EngineConfig(budget=args.budget, chunk_size=args.chunk)).generate(
            ids, max_new_tokens=1)
        # windowed_kv_bytes is a share of what the cache holds at the end (kv_cache_bytes), not of the peak
        peak, held, windowed = res.stats.peak_kv_bytes, res.stats.kv_cache_bytes, res.stats.windowed_kv_bytes
        print(f"| {length} | chunked keydiff N={args.budget} B={args.chunk} | {peak / MiB:.1f} | {held / MiB:.1f} | "
              f"{windowed / MiB:.1f} | {1 - windowed / held:.0%} |", flush=True)


if __name__ == "__main__":
    main()
