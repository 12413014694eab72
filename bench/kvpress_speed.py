"""Samples per second against NVIDIA kvpress under kvpress' protocol, the two stacks interleaved in one run.

kvpress' protocol: a context of ``L = 2000`` tokens (the chat template's head and Paul Graham's essays from
``$KDEVAL_DATA_DIR``, a different stretch per sample) is compressed once to ``N = 512`` tokens, then a short
question (with the template's tail) is fed without compression and ``16`` tokens are decoded greedily with no
eviction, all 16 on both sides (eos does not stop a sample: otherwise a side whose kept set leads to an earlier
eos decodes fewer tokens and looks faster). SmolLM2-135M-Instruct (offline), float32, CPU, 2 threads on both sides.

- kvpress: its own ``kv-press-text-generation`` pipeline with ``KeyDiffPress(compression_ratio=r)``,
  ``int(L * (1 - r)) == N``, from text (``max_context_length=L`` cuts the context to ``L`` tokens); it runs in
  its own virtualenv (the one bench/kvpress_parity.py makes) as a long-lived subprocess that serves the rounds
  over stdin/stdout, so it loads its model once and sees the same machine load as kdeval.
- kdeval: ``Engine.generate(ids, protect_last=len(question), decode_evict=False)`` on the ids kvpress' pipeline
  made, with chunks of ``B = 128`` ("chunked") and one chunk of the context (``B = L``, "one-shot"), and
  ``Engine.generate_batch`` of 8 requests at ``B = 128`` ("batch 8").

In each round the single-sample sides take turns sample by sample on ``--per-round`` samples (cycling, so every
sample is seen), and the batch side runs its 8 samples once, after them (before them, and every order reversed,
every other round). A side's samples/s in a round is its samples over their time; the ratio to kvpress is taken
within the round, so both sides of it share the load.

    python bench/kvpress_speed.py            # writes the kvpress speed section of bench/RESULTS.md
    python bench/kvpress_speed.py --print    # prints it only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from kvpress_parity import KVPRESS, QUIET, kvpress_python, write_section

BEGIN, END = "<!-- kvpress-speed:begin -->", "<!-- kvpress-speed:end -->"
L, N, NEW, B, SAMPLES, THREADS = 2000, 512, 16, 128, 8, 2
RATIO = 1 - N / L
QUESTIONS = ["What is the main point of the text above?", "Summarize the text above in one sentence.",
             "What advice does the author give?", "Who is the text written for?"]


# ---------------------------------------------------------------- kvpress side (its own virtualenv)


def kvpress_side(model_dir: str) -> None:
    """Serve requests, one JSON line each on stdin, one JSON reply line each on stdout: ``{"texts": [[context,
    question], ...]}`` → the pipeline's ids per sample; ``{"run": [i, ...]}`` → seconds and generated ids per
    sample (the eos included when it stopped there)."""
    replies, sys.stdout = sys.stdout, sys.stderr  # whatever the libraries print stays off the reply channel
    torch.set_num_threads(THREADS)
    from importlib.metadata import version

    import logging

    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    logging.getLogger("kvpress").setLevel(logging.ERROR)  # "Context length has been truncated" is the point
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = []  # the pipeline's stop ids: none, all NEW tokens are decoded
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    generated: list[list[int]] = []
    decode = tokenizer.decode  # the pipeline decodes its answer's ids once: record them there

    def recording_decode(ids, **kwargs):
        generated.append(ids.tolist())
        return decode(ids, **kwargs)

    tokenizer.decode = recording_decode
    press = kvpress.KeyDiffPress(compression_ratio=RATIO)
    texts: list = []
    for line in sys.stdin:
        request = json.loads(line)
        if "texts" in request:
            texts = request["texts"]
            ids = [pipe.preprocess(c, [q], "", L) for c, q in texts]
            reply = {"ids": [[x["context_ids"][0].tolist(), x["questions_ids"][0][0].tolist()] for x in ids],
                     "versions": {"kvpress": version("kvpress"), "transformers": transformers.__version__}}
        else:
            seconds, tokens = [], []
            for i in request["run"]:
                generated.clear()
                start = time.perf_counter()
                pipe(texts[i][0], question=texts[i][1], press=press, max_new_tokens=NEW, max_context_length=L)
                seconds.append(time.perf_counter() - start)
                tokens.append(generated[0])
            reply = {"seconds": seconds, "tokens": tokens}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class KvpressServer:
    """The kvpress side as a subprocess of this one."""

    def __init__(self, model_dir: str):
        self.proc = subprocess.Popen([str(kvpress_python()), __file__, "--kvpress-side", model_dir],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **QUIET, "PYTHONPATH": ""})

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the kvpress side stopped (exit {self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---------------------------------------------------------------- kdeval side


def texts(seed_text: str) -> list[list[str]]:
    """Per sample a context (a stretch of the essays longer than ``L`` tokens, cut by the pipeline) and a
    question."""
    stride = len(seed_text) // SAMPLES
    return [[seed_text[i * stride : i * stride + 6 * L], QUESTIONS[i % len(QUESTIONS)]] for i in range(SAMPLES)]


def kdeval_sides(lm, samples: list[tuple[torch.Tensor, int]], eos: int | None):
    """Per side, a function of sample indices → (seconds, generated ids per sample)."""
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig

    def engine(chunk: int):
        return Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=chunk))

    chunked, oneshot = engine(B), engine(L)

    def alone(eng):
        def run(picks):
            seconds, tokens = [], []
            for i in picks:
                ids, q = samples[i]
                start = time.perf_counter()
                res = eng.generate(ids, max_new_tokens=NEW, eos_token_id=eos, protect_last=q, decode_evict=False)
                seconds.append(time.perf_counter() - start)
                tokens.append(res.tokens[0])
            return seconds, tokens
        return run

    def batch(picks):
        start = time.perf_counter()
        res = chunked.generate_batch([samples[i][0][0] for i in picks], max_new_tokens=NEW, eos_token_id=eos,
                                     protect_last=[samples[i][1] for i in picks], decode_evict=False)
        return [time.perf_counter() - start], [r.tokens[0] for r in res]

    return {f"kdeval chunked B={B}": alone(chunked), f"kdeval one-shot (B={L})": alone(oneshot),
            f"kdeval batch {SAMPLES}, B={B}": batch}


# ---------------------------------------------------------------- the run


def run(rounds: int, per_round: int) -> str:
    from kdeval.evals.tasks.data import require_data_file
    from kdeval.zoo import load_model
    from kdeval.zoo.loading import smollm2_safetensors_dir

    assert int(L * (1 - RATIO)) == N
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    essays = json.loads(require_data_file(None, "haystack/PaulGrahamEssays.json", "").read_text())["text"]
    server = KvpressServer(str(smollm2_safetensors_dir()))
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    prepared = server.ask({"texts": texts(essays)})
    samples = [(torch.tensor([c + q]), len(q)) for c, q in prepared["ids"]]
    assert all(ids.shape[1] - q == L for ids, q in samples), "a context is not L tokens"
    eos = None  # every side decodes all NEW tokens (the kvpress side too)

    def kvpress_run(picks: list[int]) -> tuple[list[float], list[list[int]]]:
        reply = server.ask({"run": picks})
        return reply["seconds"], reply["tokens"]

    sides = {f"kvpress {KVPRESS} pipeline (one-shot)": kvpress_run}
    sides.update(kdeval_sides(lm, samples, eos))
    for side in sides.values():  # warm-up
        side([0])
    rate: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, dict[int, list[int]]] = {name: {} for name in sides}
    for r in range(rounds):
        order = list(sides)[:: 1 if r % 2 == 0 else -1]
        # the single-sample sides take turns sample by sample, so a burst of other work falls on all of them
        singles = [(name, [(r * per_round + j) % SAMPLES]) for j in range(per_round) for name in order
                   if "batch" not in name]
        batch = [(name, list(range(SAMPLES))) for name in order if "batch" in name]
        spent, done = dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0)
        for name, picks in singles + batch if r % 2 == 0 else batch + singles:
            seconds, got = sides[name](picks)
            spent[name] += sum(seconds)
            done[name] += len(picks)
            for i, toks in zip(picks, got):
                tokens[name][i] = [t for t in toks if t != eos] if name.startswith("kvpress") else toks
        for name in sides:
            rate[name].append(done[name] / spent[name])
        print(f"round {r + 1}/{rounds}:", ", ".join(f"{n} {v[-1]:.3f}/s" for n, v in rate.items()), flush=True)
    server.close()
    return table(rate, tokens, [q for _, q in samples], rounds, per_round, prepared["versions"],
                 time.perf_counter() - t0)


def table(rate: dict, tokens: dict, q_lens: list[int], rounds: int, per_round: int, versions: dict,
          wall: float) -> str:
    names = list(rate)
    ref = rate[names[0]]
    lines = [
        f"`python bench/kvpress_speed.py --rounds {rounds} --per-round {per_round}` ({time.strftime('%Y-%m-%d')}): "
        f"SmolLM2-135M-Instruct (offline), float32, CPU ({os.cpu_count()} cores), "
        f"{THREADS} threads on both sides; {SAMPLES} samples of {L} context tokens (chat template head + essays) "
        f"and a question of {min(q_lens)}–{max(q_lens)} tokens (with the template's tail), N={N} (kvpress: "
        f"`KeyDiffPress(compression_ratio={RATIO:.3f})`), {NEW} greedy tokens, "
        f"no eviction while decoding; kvpress {versions['kvpress']} with transformers {versions['transformers']} "
        f"in its own virtualenv, kdeval with transformers {__import__('transformers').__version__}, torch "
        f"{torch.__version__}. {rounds} rounds of {per_round} samples per single side, taking turns sample by "
        f"sample, and {SAMPLES} for the batch, after them (the order reversed every other round). samples/s: "
        f"median over rounds (min–max); x kvpress: the median of the per-round ratios (min–max).",
        "",
        "| side | samples/s | min–max | x kvpress | min–max | same tokens as kvpress |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        ratios = [a / b for a, b in zip(rate[name], ref)]
        same = sum(tokens[name][i] == tokens[names[0]].get(i) for i in tokens[name])
        lines.append(f"| {name} | {statistics.median(rate[name]):.3f} | {min(rate[name]):.3f}–{max(rate[name]):.3f} "
                     f"| {statistics.median(ratios):.2f}x | {min(ratios):.2f}–{max(ratios):.2f} "
                     f"| {same}/{len(tokens[name])} |")
    chunked, batch = tokens[names[1]], tokens[names[3]]
    lines += ["", f"The batch's rows give the tokens chunked B={B} gives alone on "
                  f"{sum(batch[i] == chunked[i] for i in chunked)}/{len(chunked)} samples. Wall time {wall:.0f} s, "
                  f"model loads and warm-up included."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=2, help="samples per round of each single-sample side")
    ap.add_argument("--print", action="store_true", help="print the table, leave RESULTS.md alone")
    ap.add_argument("--kvpress-side", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kvpress_side:
        kvpress_side(args.kvpress_side)
        return
    text = run(args.rounds, args.per_round)
    print(text)
    if not args.print:
        write_section(text, BEGIN, END, "Speed against kvpress (CPU)")


if __name__ == "__main__":
    main()
