"""GPU check and timing of the chunked engine, in one short run (fits ~8 minutes of an H200).

1. Exactness first: on a 4-layer float64 Llama-3.2-3B-shaped random model the slot store, the static layout
   run eagerly and the static layout captured as CUDA graphs give the gather store's tokens and kept sets, for
   every policy timed below. On the full-depth bf16 model the captured graphs give exactly the tokens, kept
   sets and logits of the same static step run eagerly.
2. Then timing, side by side in one run: one-pass prefill, one-pass + KeyDiff compression (what kvpress does),
   and chunked KeyDiff / full / TOVA / SnapKV / H2O / StreamingLLM at several chunk sizes B and prompt lengths
   L, N = 8K, on Llama-3.2-3B- and Llama-3.1-8B-shaped models with random bf16 weights. Time (a whole request:
   graph capture included; "warm": a second request on the same engine, reusing the first one's released
   cache and its captured graphs) and peak extra memory (``torch.cuda.max_memory_allocated`` above the weights).

Each part runs in its own process, so a failure (a capture that breaks the CUDA context, say) is recorded and
the other parts still run. Needs only torch and transformers (no Ray, no datasets).

    PYTHONPATH=. python bench/gpu_check.py --out $OUT     # on the GPU machine
    PYTHONPATH=. python bench/gpu_check.py --cpu          # tiny shapes on the CPU (graphs emulated)
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_modes import REUSED, build, engine_kwargs  # noqa: E402

POLICIES = ["keydiff", "full", "tova", "snapkv", "sink", "h2o"]  # h2o last: its capture failed once (22:08 smoke)

#: the check parts: (store, mode) variants, each compared with the first (on a CPU "graphs" is emulated)
CHECKS = {
    "exact": [("gather", "plain"), ("slot", "plain"), ("slot", "static-eager"),
              ("slot", "static-eager" + REUSED)],
    "graphs-vs-eager": [("slot", "static-eager"), ("slot", "graphs"), ("slot", "graphs" + REUSED),
                        ("slot", "plain")],
}
#: what "exact" adds on a GPU: the captured graphs themselves, in float64
EXACT_ON_CUDA = [("slot", "graphs"), ("slot", "graphs" + REUSED)]


def gpu_checks(exact_lengths: list[int]) -> list[dict]:
    """The check parts of both GPU plans, at the 3B shape: graphs against the same step run eagerly in bf16
    (full depth) and every store and layout against the gather store in float64 (4 layers)."""
    check = dict(shape="llama-3.2-3b", lengths=[4096], budget=1024, B=256)
    return [
        dict(part="graphs-vs-eager", dtype="bfloat16", **check),
        dict(part="exact", layers=4, dtype="float64", **{**check, "lengths": exact_lengths}),
    ]


def quick_plan() -> list[dict]:
    """A shorter GPU run (about 6 minutes; ``--minutes`` stops starting timed cases): the checks at one length,
    the L = N case, then the 32K cases in order of what they decide."""
    t3 = dict(shape="llama-3.2-3b", budget=8192)
    return [
        *gpu_checks([4096]),
        # L = N: every chunk is a room step (the eviction-overhead target)
        dict(part="time", **t3, lengths=[8192], cases=[("keydiff", 128, "graphs"),
                                                      ("sink", 128, "graphs"), ("full", 128, "plain")]),
        # in order of what decides the defaults: a case past the deadline is skipped
        dict(part="time", **t3, lengths=[32768], cases=[
            ("keydiff", 128, "graphs"),
            ("h2o", 128, "graphs"), ("h2o", 128, "graphs-fp32scores"), ("snapkv", 128, "graphs"),
            ("snapkv", 128, "graphs-fp32scores"), ("tova", 128, "graphs"), ("sink", 128, "graphs"),
            ("keydiff", 1024, "graphs"), ("keydiff", 256, "graphs")]),
    ]


def plan(cpu: bool, quick: bool = False) -> list[dict]:
    """The parts, in order. A timed case is (policy, B, mode), the mode as bench/engine_modes.py names it.
    ``quick`` applies to the GPU plans only (the CPU plan is short already)."""
    if quick and not cpu:
        return quick_plan()
    if cpu:
        t = dict(shape="cpu-tiny", budget=256)
        return [
            dict(part="exact", shape="cpu-tiny", layers=2, dtype="float64", lengths=[600, 200], budget=256, B=64),
            dict(part="graphs-vs-eager", shape="cpu-tiny", dtype="float32", lengths=[600], budget=256, B=64),
            dict(part="time", **t, lengths=[1024], cases=[("keydiff", 64, "graphs"),
                                                          ("keydiff", 128, "plain"), ("full", 128, "plain"),
                                                          ("h2o", 128, "graphs"),
                                                          ("h2o", 128, "graphs-fp32scores")]),
        ]
    n = 8192
    t3 = dict(shape="llama-3.2-3b", budget=n)
    return [
        *gpu_checks([4096, 900]),
        dict(part="time", **t3, lengths=[32768], cases=[
            ("keydiff", 128, "graphs"), ("keydiff", 64, "graphs"),
            ("keydiff", 256, "graphs"), ("keydiff", 1024, "graphs"),
            ("keydiff", 128, "plain"), ("keydiff", 1024, "plain"),
            ("full", 128, "plain"), ("full", 1024, "plain")]),
        dict(part="time", **t3, lengths=[32768], one_pass=False, cases=[
            ("keydiff", 128, "graphs"), ("sink", 128, "graphs"), ("tova", 128, "graphs"), ("snapkv", 128, "graphs"),
            ("tova", 128, "plain")]),
        dict(part="time", **t3, lengths=[32768], one_pass=False, cases=[
            ("h2o", 128, "graphs"), ("h2o", 128, "graphs-fp32scores"),
            ("h2o", 128, "plain")]),
        dict(part="time", **t3, lengths=[8192], cases=[
            ("keydiff", 128, "graphs"), ("sink", 128, "graphs"), ("keydiff", 128, "plain"), ("full", 128, "plain")]),
        dict(part="time", **t3, lengths=[16384, 65536], cases=[("keydiff", 128, "graphs")]),
        dict(part="time", shape="llama-3.1-8b", budget=n, lengths=[32768], cases=[
            ("keydiff", 128, "graphs"), ("keydiff", 128, "plain"), ("full", 128, "plain")]),
    ]


# ---------------------------------------------------------------------------------------------- child side


def generate(model, name, kwargs, ids, reused: bool = False):
    """``kwargs``: the engine's (:func:`engine_modes.engine_kwargs`); ``reused``: run another request first and
    release it, so this one runs on its cache and graphs."""
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine

    eng = Engine(model, get_policy(name), **kwargs)
    if reused:
        eng.release(eng.generate(ids.flip(-1)[:, : ids.shape[1] // 2 + 7], max_new_tokens=16).state)
    res = eng.generate(ids, max_new_tokens=16)
    kept = [layer.view()[1].sort(-1).values.cpu() for layer in res.state.cache.layers]
    return res.tokens[0], kept, res.state.last_logits.float().cpu(), len(res.state.cache.graphs)


def compare(spec: dict, device: str, emit, variants: list[tuple[str, str]]) -> None:
    """Every variant against the first, for every policy and prompt length of ``spec``."""
    import torch

    model = build(spec["shape"], device, getattr(torch, spec["dtype"]), spec.get("layers"))
    for L in spec["lengths"]:
        ids = torch.randint(100, model.config.vocab_size - 1, (1, L), device=device,
                            generator=torch.Generator(device).manual_seed(L))
        for name in POLICIES:
            got = {}
            for store, mode in variants:
                if name == "full" and mode != "plain":
                    continue
                try:
                    kwargs = engine_kwargs(name, spec["budget"], spec["B"], mode, store, device)
                    got[(store, mode)] = generate(model, name, kwargs, ids, mode.endswith(REUSED))
                except Exception as e:  # noqa: BLE001 - recorded, the check goes on
                    traceback.print_exc()
                    emit({"part": spec["part"], "L": L, "policy": name, "variant": f"{store}/{mode}", "error": repr(e)[:400]})
            ref_key = variants[0]
            if ref_key not in got:
                continue
            ref = got[ref_key]
            for key, (tokens, kept, logits, graphs) in got.items():
                if key != ref_key:
                    emit({"part": spec["part"], "L": L, "policy": name, "variant": f"{key[0]}/{key[1]}",
                          "reference": f"{ref_key[0]}/{ref_key[1]}", "same_tokens": tokens == ref[0],
                          "same_kept": all(torch.equal(a, b) for a, b in zip(kept, ref[1])),
                          "max_abs_logit_diff": float((logits - ref[2]).abs().max()), "graphs": graphs})


def measure(fn, device: str) -> tuple[float, float]:
    """(seconds, peak GiB allocated above what was allocated before)."""
    import torch

    gc.collect()  # captured graphs hold their caches in reference cycles
    if device == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if device == "cuda" else 0.0
    return elapsed, peak


def timing(spec: dict, device: str, emit, deadline: float) -> None:
    import torch

    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine
    from kdeval.keydiff.policy.keydiff import keydiff_scores

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = build(spec["shape"], device, dtype)
    budget = spec["budget"]

    @torch.inference_mode()
    def one_pass(ids):
        return model(ids, use_cache=True, logits_to_keep=1).past_key_values

    @torch.inference_mode()
    def one_pass_compress(ids):
        cache = one_pass(ids)
        for layer in cache.layers:
            keep = keydiff_scores(layer.keys).topk(budget, dim=-1).indices.sort(-1).values
            idx = keep.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        return cache

    base = {"shape": spec["shape"], "N": budget}
    for L in spec["lengths"]:
        ids = torch.randint(100, model.config.vocab_size - 1, (1, L), device=device)
        one_pass(ids[:, :256])  # warm-up
        # a short chunked run per case kind, so that first-use costs (kernel loading) are not timed
        for name in {c[0] for c in spec["cases"]}:
            Engine(model, get_policy(name), **engine_kwargs(name, 256, 64, "plain")).prefill(ids[:, :512])
        if spec.get("one_pass", True):
            for mode, fn in (("one-pass", one_pass), ("one-pass+keydiff-compress", one_pass_compress)):
                try:
                    t, m = measure(lambda: fn(ids), device)
                    emit({**base, "part": "time", "L": L, "mode": mode, "time_s": t, "peak_gib": m})
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    emit({**base, "part": "time", "L": L, "mode": mode, "error": repr(e)[:400]})
        for name, B, mode in spec["cases"]:
            if time.time() > deadline:
                emit({**base, "part": "time", "L": L, "mode": f"chunked {name} {mode}", "B": B, "skipped": "deadline"})
                continue
            row = {**base, "part": "time", "L": L, "mode": f"chunked {name} {mode}", "B": B}
            try:
                eng = Engine(model, get_policy(name), **engine_kwargs(name, budget, B, mode, device=device))
                done = []
                t, m = measure(lambda: done.append(eng.prefill(ids)), device)
                warm = {}
                if eng.plan.use_graphs:  # a second request on the released cache: its graphs are already captured
                    eng.release(done.pop())
                    warm["warm_s"], _ = measure(lambda: eng.prefill(ids), device)
                emit({**row, "time_s": t, "peak_gib": m, "graphs": eng.plan.use_graphs, **warm})
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                traceback.print_exc()
                emit({**row, "error": repr(e)[:400]})


def child(spec: dict, device: str, out: Path, deadline: float) -> None:
    with out.open("a") as lines:

        def emit(row: dict) -> None:
            print(json.dumps(row), flush=True)
            lines.write(json.dumps(row) + "\n")
            lines.flush()

        part = spec["part"]
        if part in CHECKS:
            variants = CHECKS[part] + (EXACT_ON_CUDA if part == "exact" and device == "cuda" else [])
            compare(spec, device, emit, variants)
        elif part == "time":
            timing(spec, device, emit, deadline)
        else:
            raise ValueError(f"part: expected 'time' or one of {list(CHECKS)}, got {part!r}")


# ---------------------------------------------------------------------------------------------- report


def table(rows: list[dict]) -> str:
    times = [r for r in rows if r.get("part") == "time"]
    base = {(r["shape"], r["L"]): r["time_s"] for r in times if r["mode"] == "one-pass" and "time_s" in r}
    kd = {(r["shape"], r["L"], r["B"]): r["time_s"] for r in times if r["mode"] == "chunked keydiff graphs" and "time_s" in r}
    warm_kd = {(r["shape"], r["L"], r["B"]): r["warm_s"] for r in times
               if r["mode"] == "chunked keydiff graphs" and "warm_s" in r}
    out = ["| shape | L | mode | B | time s | ratio to one-pass | ratio to keydiff graphs (same B) | peak extra GiB "
           "| warm s | warm ratio to one-pass | warm ratio to keydiff graphs |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in times:
        head = f"| {r['shape']} | {r['L']} | {r['mode']} | {r.get('B', '-')} |"
        if "time_s" not in r:
            out.append(f"{head} {r.get('error', r.get('skipped', ''))[:90]} | | | | | | |")
            continue
        one = base.get((r["shape"], r["L"]))
        ref = kd.get((r["shape"], r["L"], r.get("B")))
        ratio = f"{r['time_s'] / one:.2f}x" if one else "-"
        vs = f"{r['time_s'] / ref:.2f}x" if ref and "B" in r else "-"
        warm = r.get("warm_s")
        wref = warm_kd.get((r["shape"], r["L"], r.get("B")))
        warm_cols = (f" {warm:.3f} | {warm / one:.2f}x |" if one else f" {warm:.3f} | - |") if warm else " - | - |"
        warm_cols += f" {warm / wref:.2f}x |" if warm and wref else " - |"
        out.append(f"{head} {r['time_s']:.3f} | {ratio} | {vs} | {r['peak_gib']:.2f} |{warm_cols}")
    checks = [r for r in rows if r.get("part") in CHECKS]
    out += ["", "| check | L | policy | variant | reference | same tokens | same kept | max abs logit diff |",
            "|---|---|---|---|---|---|---|---|"]
    for r in checks:
        if "error" in r:
            out.append(f"| {r['part']} | {r['L']} | {r['policy']} | {r['variant']} | error: {r['error'][:80]} | | | |")
        else:
            out.append(f"| {r['part']} | {r['L']} | {r['policy']} | {r['variant']} | {r['reference']} | "
                       f"{r['same_tokens']} | {r['same_kept']} | {r['max_abs_logit_diff']:.3g} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU, to test this script")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--minutes", type=float, default=7.0, help="stop starting new timed cases after this long")
    ap.add_argument("--quick", action="store_true", help="the short plan (checks at one length, headline cases)")
    ap.add_argument("--table-only", action="store_true",
                    help="rebuild gpu_check.md from the rows already in --out (after a run that was cut)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "gpu_check.jsonl"
    device = "cpu" if args.cpu else "cuda"
    if args.child:
        child(json.loads(args.child), device, rows_path, args.deadline)
        return
    if args.table_only:
        rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
        (out / "gpu_check.md").write_text(table(rows) + "\n")
        print(table(rows))
        return
    start = time.time()
    deadline = start + 60 * args.minutes
    rows_path.write_text("")
    parts = []
    for spec in plan(args.cpu, args.quick):
        cmd = [sys.executable, __file__, "--out", str(out), "--child", json.dumps(spec), "--deadline", str(deadline)]
        if args.cpu:
            cmd.append("--cpu")
        t = time.time()
        rc = subprocess.call(cmd)
        parts.append({"part": spec["part"], "shape": spec["shape"], "lengths": spec["lengths"], "rc": rc,
                      "seconds": round(time.time() - t, 1)})
        print(json.dumps(parts[-1]), flush=True)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    from kdeval.version import code_version  # the package's source hash: ties the figures to the code

    report = {"device": device, "code_version": code_version(), "parts": parts, "rows": rows,
              "elapsed_s": time.time() - start}
    if device == "cuda":
        import torch

        report.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_check.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
