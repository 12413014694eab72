"""Two source trees of kdeval timed against each other on the CPU: chunked prefill and decode, case by case.

Each case runs in a fresh subprocess with ``PYTHONPATH`` set to one tree (``--before``, ``--after``); the two trees
alternate case by case and round by round, so load from other processes on the machine falls on both alike.
A case: SmolLM2-135M (offline) in float32, one prompt of ``L`` random tokens, budget ``N``, chunk ``B``: the
median of three chunked prefills after a warm-up, then ``G`` greedy tokens after a fresh prefill (the decode
time is ``RunStats.decode_s``: from the first generated token to the last); with ``--rows R`` (default 4; 0: none)
also one ``generate_batch`` of ``R`` prompts of ``L``, ``L - L/2R``, ... tokens, ``G`` greedy tokens each, timed
whole (batch 1 is the cases above).

    git worktree add ../kdeval-before d5ff9d2
    python bench/before_after.py --before ../kdeval-before --after . --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

POLICIES = ("keydiff", "snapkv", "ada-keydiff", "full")


def run_case(case: dict) -> dict:
    """One case in this process (the tree on ``sys.path`` is the one timed)."""
    import torch

    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    torch.manual_seed(0)
    lm = load_model(case["model"], device="cpu")
    vocab = lm.model.config.vocab_size
    ids = torch.randint(100, vocab - 1, (1, case["L"]))
    budget = None if case["policy"] == "full" else case["N"]
    engine = Engine(lm.model, get_policy(case["policy"]), EngineConfig(budget=budget, chunk_size=case["B"]))
    engine.generate(ids[:, : case["B"] * 2], max_new_tokens=2)  # warm-up: the same code path on a short prompt
    prefill = []
    for _ in range(3):
        start = time.perf_counter()
        engine.prefill(ids)
        prefill.append(time.perf_counter() - start)
    res = engine.generate(ids, max_new_tokens=case["G"])
    out = {**case, "prefill_s": statistics.median(prefill),
           "decode_ms_per_token": 1e3 * res.stats.decode_s / max(res.stats.decode_tokens - 1, 1),
           "tokens": [res.tokens[0]], "threads": torch.get_num_threads()}
    if case["rows"]:
        lengths = [case["L"] - i * case["L"] // (2 * case["rows"]) for i in range(case["rows"])]
        start = time.perf_counter()
        batch = engine.generate_batch([ids[0, :n] for n in lengths], max_new_tokens=case["G"])
        out["batch_s"] = time.perf_counter() - start
        out["tokens"] += [r.tokens[0] for r in batch]
    return out


def spawn(tree: str, case: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True,
                         env=env, cwd=str(Path(tree).resolve()), timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"case {case} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case")
    ap.add_argument("--before", help="the tree timed as 'before'")
    ap.add_argument("--after", help="the tree timed as 'after'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--L", type=int, default=2048)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--G", type=int, default=16)
    ap.add_argument("--rows", type=int, default=4)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    if not (args.before and args.after):
        raise SystemExit("--before and --after: expected two kdeval source trees")
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for policy in args.policies.split(","):
            case = {"model": "smollm2-135m", "policy": policy, "L": args.L, "N": args.N, "B": args.B, "G": args.G,
                    "rows": args.rows}
            order = (("before", args.before), ("after", args.after))
            for side, tree in order if r % 2 == 0 else order[::-1]:
                rows.setdefault((policy, side), []).append(spawn(tree, case))
                print(side, policy, {k: v for k, v in rows[(policy, side)][-1].items() if k != "tokens"}, flush=True)
    print(f"\nL={args.L}, N={args.N}, B={args.B}, {args.G} greedy tokens, smollm2-135m float32, CPU; median over "
          f"{args.rounds} interleaved rounds\n")
    print("| policy | prefill s before | prefill s after | after/before | decode ms/token before | after | "
          f"after/before | batch of {args.rows} s before | after | after/before | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for policy in args.policies.split(","):
        b, a = rows[(policy, "before")], rows[(policy, "after")]
        pb, pa = statistics.median(x["prefill_s"] for x in b), statistics.median(x["prefill_s"] for x in a)
        db = statistics.median(x["decode_ms_per_token"] for x in b)
        da = statistics.median(x["decode_ms_per_token"] for x in a)
        same = all(x["tokens"] == y["tokens"] for x, y in zip(a, b))
        batch = "| - | - | - "
        if args.rows:
            bb, ba = (statistics.median(x["batch_s"] for x in side) for side in (b, a))
            batch = f"| {bb:.2f} | {ba:.2f} | {ba / bb:.2f}x "
        print(f"| {policy} | {pb:.2f} | {pa:.2f} | {pa / pb:.2f}x | {db:.1f} | {da:.1f} | {da / db:.2f}x "
              f"{batch}| {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
