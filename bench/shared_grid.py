"""What a grid costs: ``kdeval submit`` with shared execution vs ``execution: {share: false}``, and kvpress running
each press x ratio as its own pipeline over the same samples, side by side in one run.

Samples: ``--samples`` needle prompts of about ``--length`` tokens over Paul Graham's essays (``$KDEVAL_DATA_DIR``),
SmolLM2-135M-Instruct (offline), float32, CPU, ``--new`` greedy tokens.

- ``leaderboard``: kvpress's leaderboard shape: ``full`` and keydiff, snapkv, tova, knorm, sink,
  expected-attention at three shares of each prompt, one-shot (``chunk_sizes: [whole]``), query-agnostic
  (``compress: context``) and query-aware (``compress: prompt``).
- ``paper``: the KeyDiff paper's shape: the same policies at N = 256/512/1,024, B = 128 (``compress: prompt``).
- ``mixed``: both chunk sizes (whole and 128) at the leaderboard's shares, query-agnostic.

kdeval: each grid submitted twice with fresh indexes, shared first and alone second (then the order reversed in
the next round), wall time of the whole ``kdeval submit`` command. For the leaderboard grid (kvpress has no
chunked prefill), kvpress 0.5.5 (its own virtualenv, the one
bench/kvpress_parity.py makes): its ``kv-press-text-generation`` pipeline with each press and
``compression_ratio = 1 - share`` over every sample's context and question (query-aware: the question inside the
compressed context), the same samples' texts; its time is summed over press x ratio x protocol x samples, as
kvpress's evaluation/leaderboard.sh launches them one after another (its model load counted once).

    python bench/shared_grid.py                 # every grid, writes its section of bench/RESULTS.md
    python bench/shared_grid.py --grids paper --print
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvpress_parity import KVPRESS, QUIET, kvpress_python, write_section

BEGIN, END = "<!-- shared-grid:begin -->", "<!-- shared-grid:end -->"
POLICIES = ["keydiff", "snapkv", "tova", "knorm", "sink", "expected-attention"]
PRESSES = {"keydiff": "KeyDiffPress", "snapkv": "SnapKVPress", "tova": "TOVAPress", "knorm": "KnormPress",
           "sink": "StreamingLLMPress", "expected-attention": "ExpectedAttentionPress"}
SHARES = ["25%", "50%", "75%"]
THREADS = 2


def depths(samples: int) -> list[int]:
    """One needle depth per sample, spread over the context."""
    return [round(5 + 90 * i / max(samples - 1, 1)) for i in range(samples)]


def grid(name: str, length: int, samples: int, new: int, share: bool, time_first: bool = True) -> dict:
    """The grid ``name`` as kdeval reads it (``time_first`` False: accuracy only, no sample timed alone)."""
    base = {"name": f"bench-{name}", "models": [{"id": "smollm2-135m", "dtype": "float32"}],
            "policies": ["full", *POLICIES],
            "tasks": [{"name": "needle", "lengths": [length], "samples": samples, "params": {"depths": depths(samples)}}],
            "generation": {"max_new_tokens": new}, "resources": {"workers": 1, "cpus_per_worker": THREADS},
            "execution": {"share": share, "time_first": time_first}}
    if name == "leaderboard":
        base.update(budgets=SHARES, chunk_sizes=["whole"],
                    protocol=[{"compress": "context", "decode": "keep"}, {"compress": "prompt", "decode": "keep"}])
    elif name == "paper":
        base.update(budgets=[256, 512, 1024], chunk_sizes=[128], protocol={"compress": "prompt"})
    else:
        base.update(budgets=SHARES, chunk_sizes=["whole", 128], protocol={"compress": "context", "decode": "keep"})
    return base


def submit(spec: dict, tmp: Path) -> tuple[float, int, str]:
    """Wall seconds of ``kdeval submit`` on a fresh index, the cells it ran, and its last output line."""
    import yaml

    tag = f"{spec['name']}-{'shared' if spec['execution']['share'] else 'alone'}-{time.monotonic_ns()}"
    if not spec["execution"]["time_first"]:
        tag = "untimed-" + tag
    path = tmp / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(spec))
    kdeval = Path(sys.executable).with_name("kdeval")
    t0 = time.perf_counter()
    out = subprocess.run([str(kdeval), "submit", str(path), "--db", str(tmp / f"{tag}.sqlite"),
                          "--results-dir", str(tmp / tag)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"kdeval submit failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    last = [line for line in out.stdout.splitlines() if line.strip()][-1]
    cells = int(out.stdout.split(" cells,")[0].rsplit(" ", 1)[-1])
    return seconds, cells, last


# ---------------------------------------------------------------- kvpress side (its own virtualenv)


def kvpress_side(model_dir: str, request_file: str) -> None:
    """Run every (press, ratio, protocol) pipeline of the request over its samples; print one JSON line: the
    seconds of each, summed over its samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    import kvpress

    torch.set_num_threads(THREADS)
    request = json.loads(Path(request_file).read_text())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = []  # every sample decodes all its tokens, as kdeval's do
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    out = []
    for name, ratio, aware in request["runs"]:
        press = getattr(kvpress, name)(compression_ratio=ratio) if name else None
        t0 = time.perf_counter()
        for context, question in request["texts"]:
            if aware:  # query-aware: the question is part of what is compressed
                pipe(context + question, question="", press=press, max_new_tokens=request["new"])
            else:
                pipe(context, question=question, press=press, max_new_tokens=request["new"])
        out.append(time.perf_counter() - t0)
    print(json.dumps({"seconds": out}))


def kvpress_runs(name: str = "leaderboard") -> list[tuple[str | None, float, bool]]:
    """(press, ratio, query-aware) of each pipeline kvpress runs for grid ``name``: one per cell."""
    protocols = [False, True]
    ratios = [1 - float(s.rstrip("%")) / 100 for s in SHARES]
    runs = [(None, 0.0, aware) for aware in protocols]
    runs += [(PRESSES[p], r, aware) for aware in protocols for p in POLICIES for r in ratios]
    return runs


def kvpress_seconds(texts: list[list[str]], runs: list, new: int, tmp: Path) -> float:
    from kdeval.zoo.loading import smollm2_safetensors_dir

    request = tmp / "kvpress-request.json"
    request.write_text(json.dumps({"texts": texts, "runs": runs, "new": new}))
    out = subprocess.run([str(kvpress_python()), __file__, "--kvpress-side", str(smollm2_safetensors_dir()),
                          str(request)], capture_output=True, text=True, env={**os.environ, **QUIET, "PYTHONPATH": ""})
    if out.returncode != 0:
        raise SystemExit(f"the kvpress side failed:\n{out.stderr[-3000:]}")
    return sum(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def sample_texts(length: int, samples: int, new: int) -> list[list[str]]:
    """The needle samples' contexts and questions as text (what kdeval's grid runs), for kvpress."""
    from kdeval.evals import get_task
    from kdeval.evals.tasks.prompting import PromptBuilder
    from kdeval.zoo import load_model

    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    task = get_task("needle", lengths=[length], depths=depths(samples), max_new_tokens=new)
    return [[s.prefix, s.suffix] for s in task.samples(PromptBuilder(lm.tokenizer, lm.max_context))[:samples]]


def members(spec: dict) -> list:
    """The grid's cells as ``evals.task_run.group_run.run_group`` members, ``RunSettings`` (``--in-process``)."""
    from kdeval.evals.task_run.settings import RunSettings

    protocols = spec["protocol"] if isinstance(spec["protocol"], list) else [spec["protocol"]]
    out = []
    for proto in protocols:
        for policy in spec["policies"]:
            for budget in ([None] if policy == "full" else spec["budgets"]):
                for chunk in spec["chunk_sizes"]:
                    out.append(RunSettings(policy=policy, budget=budget, chunk_size=chunk, compress=proto["compress"],
                                           decode=proto.get("decode", "evict"),
                                           max_new_tokens=spec["generation"]["max_new_tokens"]))
    return out


def in_process(name: str, length: int, samples: int, new: int) -> tuple[float, float, int]:
    """Seconds of ``run_group`` shared and of every member alone as ``kdeval submit`` runs them on a CPU (batch
    unset: alone at 8; shared, chunked members fork then batch at 8, one-shot members at 1), in this process, no
    Ray; and the number of cells."""
    import torch

    from kdeval.evals import get_task
    from kdeval.evals.task_run import group_run, runner
    from kdeval.zoo import load_model

    torch.set_num_threads(THREADS)
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    task = get_task("needle", lengths=[length], depths=depths(samples), max_new_tokens=new)
    prompts = runner.model_prompts(lm, task, limit=samples, max_new_tokens=new)
    cells = members(grid(name, length, samples, new, True))
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=None) for c in cells], prompts, batch_size=8)
    shared = time.perf_counter() - t0
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=8) for c in cells], prompts, share=False)
    return shared, time.perf_counter() - t0, len(cells)


def run(grids: list[str], length: int, samples: int, new: int, rounds: int, with_kvpress: bool,
        untimed: bool = False) -> str:
    flags = " --untimed" if untimed else ""
    lines = [f"`python bench/shared_grid.py --grids {','.join(grids)} --length {length} --samples {samples} "
             f"--new {new} --rounds {rounds}{flags}` (SmolLM2-135M float32, CPU, {THREADS} threads, 1 worker; wall "
             "time of the whole command, model load and Ray start included; median of the rounds):", "",
             "| grid | cells | cell-samples | shared s | alone s | alone / shared | kvpress s | kvpress / shared |",
             "|---|---|---|---|---|---|---|---|"]
    if untimed:  # a third side: shared with no sample timed alone (execution: {time_first: false})
        lines[-2:] = ["| grid | cells | cell-samples | shared s | alone s | alone / shared | shared untimed s "
                      "| alone / untimed |", "|---|---|---|---|---|---|---|---|"]
    texts = sample_texts(length, samples, new) if with_kvpress else []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in grids:
            sides = ["shared", "alone"] + (["untimed"] if untimed else [])
            times: dict[str, list[float]] = {side: [] for side in sides}
            cells = 0
            for r in range(rounds):
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    spec = grid(name, length, samples, new, side != "alone", time_first=side != "untimed")
                    s, cells, last = submit(spec, tmp)
                    times[side].append(s)
                    print(f"{name} {side}: {s:.1f} s ({last})", flush=True)
            shared, alone = (sorted(times[k])[len(times[k]) // 2] for k in ("shared", "alone"))
            if untimed:
                quick = sorted(times["untimed"])[len(times["untimed"]) // 2]
                lines.append(f"| {name} | {cells} | {cells * samples} | {shared:.0f} | {alone:.0f} | "
                             f"{alone / shared:.2f}x | {quick:.0f} | {alone / quick:.2f}x |")
                continue
            kv = kvpress_seconds(texts, kvpress_runs(name), new, tmp) if with_kvpress and name == "leaderboard" else None
            if kv is not None:
                print(f"{name} kvpress: {kv:.1f} s", flush=True)
            kv_text = f"{kv:.0f} | {kv / shared:.2f}x" if kv is not None else "- | -"
            lines.append(f"| {name} | {cells} | {cells * samples} | {shared:.0f} | {alone:.0f} | {alone / shared:.2f}x "
                         f"| {kv_text} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grids", default="leaderboard,paper,mixed")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-kvpress", action="store_true", help="kdeval's sides only")
    ap.add_argument("--print", action="store_true", help="print the table, leave RESULTS.md alone")
    ap.add_argument("--untimed", action="store_true",
                    help="add a side: shared with no sample timed alone (execution: {time_first: false}); no kvpress")
    ap.add_argument("--in-process", action="store_true",
                    help="kdeval only, through evals.task_run.group_run.run_group in this process (no Ray, no model load timed)")
    ap.add_argument("--kvpress-side", nargs=2, metavar=("MODEL_DIR", "REQUEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kvpress_side:
        kvpress_side(*args.kvpress_side)
        return
    if args.in_process:
        for name in args.grids.split(","):
            shared, alone, n = in_process(name, args.length, args.samples, args.new)
            print(f"| {name} (in process) | {n} | {n * args.samples} | {shared:.0f} | {alone:.0f} | {alone / shared:.2f}x |",
                  flush=True)
        return
    text = run(args.grids.split(","), args.length, args.samples, args.new, args.rounds,
               not (args.no_kvpress or args.untimed), args.untimed)
    print(text)
    if not args.print:
        write_section(text, BEGIN, END, "A grid's cost: shared execution vs alone vs kvpress (CPU)")


if __name__ == "__main__":
    main()
