"""GPU check and timing of the chunked engine, in one short run (fits ~8 minutes of an H200).

1. Exactness first: the slot store and the gather store generate the same tokens and keep the same positions
   on a Llama-shaped random model, for every policy timed below.
2. Then timing, side by side in one process: one-pass prefill, one-pass + KeyDiff compression (what kvpress
   does), and chunked KeyDiff / full / TOVA / SnapKV at several chunk sizes B and prompt lengths L, N = 8K,
   on Llama-3.2-3B- and Llama-3.1-8B-shaped models with random bf16 weights. Time and peak extra memory
   (``torch.cuda.max_memory_allocated`` above the weights) per case, ratios to one-pass prefill.

Needs only torch and transformers (no Ray, no datasets). Writes JSON and a markdown table to ``--out`` and,
with ``--results``, the gpu section of bench/RESULTS.md.

    PYTHONPATH=. python bench/gpu_check.py --out $OUT            # on the GPU machine
    PYTHONPATH=. python bench/gpu_check.py --cpu                   # tiny shapes, to test the script here
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.keydiff import keydiff_scores

SHAPES = {
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "cpu-tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=16, vocab_size=512),
}


def build(shape: str, device: str, dtype: torch.dtype, max_pos: int, layers: int | None = None) -> LlamaForCausalLM:
    params = dict(SHAPES[shape])
    if layers:
        params["num_hidden_layers"] = layers
    config = LlamaConfig(**params, max_position_embeddings=max_pos, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, device: str) -> tuple[float, float]:
    """(seconds, peak extra GiB above what was allocated before)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    elapsed = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if device == "cuda" else 0.0
    return elapsed, peak


@torch.inference_mode()
def one_pass(model, ids):
    out = model(ids, use_cache=True, logits_to_keep=1)
    return out.past_key_values


@torch.inference_mode()
def one_pass_compress(model, ids, budget):
    cache = one_pass(model, ids)
    for layer in cache.layers:
        keep = keydiff_scores(layer.keys).topk(budget, dim=-1).indices.sort(-1).values
        idx = keep.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
    return cache


def exactness(model, device: str, L: int, budget: int, B: int, policies: list[str], graphs: bool) -> list[dict]:
    """Slot store vs gather store, and (on CUDA) graph-captured vs plain steps: same tokens, same kept sets."""
    ids = torch.randint(100, model.config.vocab_size - 1, (1, L), device=device)
    rows = []
    variants = [("gather", False), ("slot", False)] + ([("slot", True)] if graphs else [])
    for name in policies:
        got = {}
        for store, g in variants:
            cfg = EngineConfig(budget=None if name == "full" else budget, chunk_size=B, store=store,
                               cuda_graphs=g and name != "full")
            res = Engine(model, get_policy(name), cfg).generate(ids, max_new_tokens=16)
            got[(store, g)] = (res.tokens[0], [l.view()[1].sort(-1).values.cpu() for l in res.state.cache.layers])
        ref = got[("gather", False)]
        for key, (tokens, kept) in got.items():
            if key == ("gather", False):
                continue
            rows.append({"policy": name, "variant": f"{key[0]}{'+graphs' if key[1] else ''}",
                         "same_tokens": tokens == ref[0],
                         "same_kept": all(torch.equal(a, b) for a, b in zip(kept, ref[1]))})
    return rows


def timing(model, shape: str, device: str, lengths, cases, budget, deadline) -> list[dict]:
    """``cases``: (policy, B, graphs) triples timed at every length, after one-pass and one-pass + compress."""
    rows = []

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for L in lengths:
        if time.time() > deadline:
            break
        ids = torch.randint(100, model.config.vocab_size - 1, (1, L), device=device)
        one_pass(model, ids[:, :256])  # warm-up
        t, m = measure(lambda: one_pass(model, ids), device)
        add({"shape": shape, "L": L, "mode": "one-pass", "time_s": t, "peak_gib": m})
        t, m = measure(lambda: one_pass_compress(model, ids, budget), device)
        add({"shape": shape, "L": L, "mode": "one-pass+keydiff-compress", "time_s": t, "peak_gib": m})
        for name, B, graphs in cases:
            if time.time() > deadline:
                return rows
            cfg = EngineConfig(budget=None if name == "full" else budget, chunk_size=B, cuda_graphs=graphs)
            eng = Engine(model, get_policy(name), cfg)
            t, m = measure(lambda: eng.prefill(ids), device)
            mode = f"chunked {name}" + (" +graphs" if graphs else "")
            add({"shape": shape, "L": L, "mode": mode, "B": B, "N": budget, "time_s": t, "peak_gib": m})
    return rows


def table(rows: list[dict]) -> str:
    base = {(r["shape"], r["L"]): r["time_s"] for r in rows if r["mode"] == "one-pass"}
    out = ["| shape | L | mode | B | time s | ratio to one-pass | peak extra GiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["time_s"] / base[(r["shape"], r["L"])]
        out.append(f"| {r['shape']} | {r['L']} | {r['mode']} | {r.get('B', '-')} | {r['time_s']:.3f} | {ratio:.2f}x | {r['peak_gib']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU, to test this script")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--minutes", type=float, default=7.0, help="stop starting new cases after this long")
    args = ap.parse_args()
    start = time.time()
    deadline = start + 60 * args.minutes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = ["keydiff", "full", "tova", "snapkv", "h2o"]
    gpu = not args.cpu
    all_b = [(p, b, g) for b in (64, 128, 256, 1024) for p, g in (("keydiff", False), ("keydiff", gpu))]
    per_policy = [("full", 128, False), ("tova", 128, gpu), ("snapkv", 128, gpu), ("h2o", 128, gpu)]
    if args.cpu:
        device, dtype = "cpu", torch.float32
        plan = [("cpu-tiny", [1024, 2048], [("keydiff", 64, False), ("keydiff", 128, False)] + per_policy, 256)]
        exact = ("cpu-tiny", 600, 128, 64)
    else:
        device, dtype = "cuda", torch.bfloat16
        plan = [("llama-3.2-3b", [32768], all_b + per_policy, 8192),
                ("llama-3.2-3b", [16384, 65536], [("keydiff", 128, True), ("keydiff", 128, False)], 8192),
                ("llama-3.1-8b", [32768], [("keydiff", 128, True), ("keydiff", 128, False), ("full", 128, False)], 8192)]
        exact = ("llama-3.2-3b", 4096, 256, 1024)
    report: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "torch": torch.__version__}
    # float32 and 4 layers: in bf16 the permuted summation order can flip near-tied scores of random weights
    model = build(exact[0], device, torch.float32, 131072, layers=4)
    report["exactness"] = exactness(model, device, exact[1], exact[3], exact[2], policies, gpu)
    print(json.dumps(report["exactness"]), flush=True)
    rows: list[dict] = []
    current = None
    for shape, lengths, cases, budget in plan:
        if shape != current:
            model = None
            if device == "cuda":
                torch.cuda.empty_cache()
            model = build(shape, device, dtype, 131072)
            current = shape
        rows += timing(model, shape, device, lengths, cases, budget, deadline)
    report["timing"] = rows
    report["elapsed_s"] = time.time() - start
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_check.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
