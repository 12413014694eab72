"""Engine benchmark: one-pass prefill vs chunked full cache vs chunked KeyDiff, and every policy side by side.

Each case runs in a fresh subprocess (so peak memory is that case's alone): after a warm-up on a shorter
prompt, the median of ``repeats`` prefill times, the peak RSS above the RSS after warm-up (sampled every 2 ms)
and the KV-cache bytes held at the end.

    python bench/engine.py                        # full CPU run, writes the engine section of bench/RESULTS.md
    python bench/engine.py --parts policies       # one table again (others kept from bench/out/)
    python bench/engine.py --quick                # small lengths, prints only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from kdeval.keydiff.loop.memory import current_rss_bytes

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
BEGIN, END = "<!-- engine:begin -->", "<!-- engine:end -->"


# ---------------------------------------------------------------- one case, in its own process


class _Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, False

    def run(self) -> None:
        while not self.stop:
            self.peak = max(self.peak, current_rss_bytes())
            time.sleep(0.002)


def run_case(case: dict) -> dict:
    import torch

    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    torch.manual_seed(0)
    overrides = {"max_position_embeddings": 16384} if case["model"].startswith("random:") else None
    lm = load_model(case["model"], device="cpu", overrides=overrides)
    L = case["L"]
    vocab = lm.model.config.vocab_size
    ids = torch.randint(min(100, vocab - 1), vocab - 1, (1, L))

    def once(x: torch.Tensor) -> int:
        """Run the case's mode on ``x``; return the KV-cache bytes it held."""
        with torch.inference_mode():
            if case["mode"] == "onepass":
                out = lm.model(x, use_cache=True, logits_to_keep=1)
                return sum(l.keys.numel() * l.keys.element_size() * 2 for l in out.past_key_values.layers)
            engine = Engine(lm.model, get_policy(case["policy"]),
                            EngineConfig(budget=case.get("budget"), chunk_size=case["B"]))
            return engine.prefill(x).cache.nbytes()

    once(ids[:, : min(L, 1024)])  # warm-up: the same code path, kernels and allocator on a shorter prompt
    base = current_rss_bytes()
    sampler = _Sampler()
    sampler.start()
    times = []
    for _ in range(3 if L < 8192 else 2):
        start = time.perf_counter()
        kv_bytes = once(ids)
        times.append(time.perf_counter() - start)
    sampler.stop = True
    sampler.join()
    times.sort()
    return {**case, "time_s": times[len(times) // 2], "times": times,
            "peak_extra_mib": max(0, sampler.peak - base) / 2**20, "kv_mib": kv_bytes / 2**20,
            "threads": torch.get_num_threads()}


def spawn(case: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the grid and the tables


def scaling_cases(model: str, lengths: list[int], B: int, fixed_n: int) -> list[dict]:
    """One-pass, chunked full, chunked KeyDiff at N = L/4 and at a fixed N (its memory must stay flat)."""
    cases = []
    for L in lengths:
        cases.append({"model": model, "L": L, "mode": "onepass"})
        cases.append({"model": model, "L": L, "mode": "chunked", "policy": "full", "B": B})
        cases.append({"model": model, "L": L, "mode": "chunked", "policy": "keydiff", "budget": L // 4, "B": B})
        if fixed_n != L // 4:
            cases.append({"model": model, "L": L, "mode": "chunked", "policy": "keydiff", "budget": fixed_n, "B": B})
    return cases


def scaling_table(rows: list[dict]) -> str:
    lines = ["| model | L | mode | time s | ratio to one-pass | peak extra RSS MiB | KV cache MiB |", "|---|---|---|---|---|---|---|"]
    onepass = {(r["model"], r["L"]): r["time_s"] for r in rows if r["mode"] == "onepass"}
    for r in rows:
        mode = "one-pass prefill" if r["mode"] == "onepass" else (
            f"chunked {r['policy']} B={r['B']}" + (f" N={r['budget']}" if r.get("budget") else ""))
        ratio = r["time_s"] / onepass[(r["model"], r["L"])]
        lines.append(f"| {r['model']} | {r['L']} | {mode} | {r['time_s']:.2f} | {ratio:.2f}x | {r['peak_extra_mib']:.0f} | {r['kv_mib']:.1f} |")
    return "\n".join(lines)


def policy_table(rows: list[dict]) -> str:
    ref = next(r["time_s"] for r in rows if r["policy"] == "keydiff")
    lines = ["| policy | time s | ratio to keydiff | peak extra RSS MiB | KV cache MiB |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['time_s']:.2f} | {r['time_s'] / ref:.2f}x | {r['peak_extra_mib']:.0f} | {r['kv_mib']:.1f} |")
    return "\n".join(lines)


def write_section(text: str) -> None:
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in old:
        pre, rest = old.split(BEGIN, 1)
        new = pre + block + rest.split(END, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--quick", action="store_true", help="small lengths, print only")
    ap.add_argument("--parts", default="tiny,smollm2,policies", help="which tables to run")
    ap.add_argument("--policies", default="keydiff,full,sink,tova,h2o,snapkv,knorm,random")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    lengths = [512, 1024] if args.quick else [2048, 4096, 8192]
    B = 128
    out_dir = HERE / "out"
    out_dir.mkdir(exist_ok=True)
    models = {"tiny": "random:llama-tiny", "smollm2": "smollm2-135m"}
    for part in args.parts.split(","):
        if part in models:
            rows = [spawn(c) for c in scaling_cases(models[part], lengths, B, lengths[0] // 2)]
            text = scaling_table(rows)
        elif part == "policies":
            L = lengths[-1]
            rows = []
            for p in args.policies.split(","):
                case = {"model": "smollm2-135m", "L": L, "mode": "chunked", "policy": p, "B": B}
                if p != "full":
                    case["budget"] = L // 4
                rows.append(spawn(case))
            text = f"Policies, chunked, smollm2-135m, L={L}, N={L // 4}, B={B}:\n\n" + policy_table(rows)
        else:
            raise SystemExit(f"--parts: unknown part {part!r}; expected tiny, smollm2 or policies")
        print(text, flush=True)
        if not args.quick:
            (out_dir / f"engine-{part}.md").write_text(text + "\n")
            (out_dir / f"engine-{part}.json").write_text(json.dumps(rows, indent=1))
    if not args.quick:
        import platform

        import torch

        header = (f"## Engine (CPU)\n\n`python bench/engine.py` on {platform.machine()}, {os.cpu_count()} cores, "
                  f"torch {torch.__version__}, float32, batch 1, SDPA, {time.strftime('%Y-%m-%d')}. Times are the "
                  "median of 3 runs (2 at 8K) after a warm-up; peak extra RSS is sampled every 2 ms above the RSS "
                  "after warm-up (noisy: the allocator keeps freed blocks); KV cache MiB is what the cache holds.\n")
        parts = [(out_dir / f"engine-{p}.md").read_text() for p in ("tiny", "smollm2", "policies")
                 if (out_dir / f"engine-{p}.md").exists()]
        write_section(header + "\n" + "\n\n".join(parts))


if __name__ == "__main__":
    main()
