"""Peak KV bytes of a recurrent hybrid against prompt length: chunked KeyDiff (N per full-attention layer) beside
one pass, with the recurrent layers' states apart.

The model has Qwen3.5's layer pattern (3 gated-DeltaNet layers to 1 full-attention layer, 8 layers; the full
layers 2 KV heads of 256 channels, a quarter of each rotated) with random weights and a small hidden size: KV
bytes depend only on the attention shape, state bytes on the linear layers' heads. One pass is transformers' own
prefill into its ``DynamicCache`` (full layers hold every token); past ``--one-pass-max`` tokens its KV bytes are
computed from that rule (tokens x bytes per token) instead of measured, and labelled so.

    python bench/recurrent_memory.py [--lengths 4096,16384,65536] [--budget 1024] [--chunk 128]
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig

MiB = 2**20
TYPES = ["linear_attention"] * 3 + ["full_attention"]


def model(context: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "qwen3_5_text", vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256, layer_types=TYPES * 2,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4,
        linear_num_value_heads=8, max_position_embeddings=context)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def one_pass(m: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """(KV bytes, state bytes) of transformers' own one-pass prefill of ``ids``."""
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(ids, past_key_values=cache, use_cache=True)
    kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if hasattr(layer, "keys"))
    states = sum(t.nbytes for layer in cache.layers for d in (getattr(layer, "conv_states", {}),
                                                              getattr(layer, "recurrent_states", {}))
                 for t in d.values() if t is not None)
    return kv, states


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--one-pass-max", type=int, default=4096, help="longest prompt whose one pass is measured")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    m = model(max(lengths) + 8)  # the prompt and a token past it
    per_token = None
    print(f"{'tokens':>7} {'one-pass KV MiB':>16} {'keydiff peak KV MiB':>20} {'states MiB':>11} "
          f"{'kept':>5} {'s':>6}")
    for n in lengths:
        ids = torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(0))
        if n <= a.one_pass_max:
            kv, _ = one_pass(m, ids)
            per_token = kv / n
            measured = ""
        else:
            kv, measured = int(per_token * n), " (rule)"
        t0 = time.perf_counter()
        eng = Engine(m, get_policy("keydiff"), EngineConfig(budget=a.budget, chunk_size=a.chunk))
        res = eng.generate(ids, max_new_tokens=1)
        took = time.perf_counter() - t0
        print(f"{n:>7} {kv / MiB:>16.2f}{measured} {res.stats.peak_kv_bytes / MiB:>20.3f} "
              f"{res.stats.state_bytes / MiB:>11.3f} {res.stats.kept_tokens:>5} {took:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
