"""Parity of kdeval's ``cam`` with kvpress' ``CAMPress``: one compression step's inputs recorded on the kvpress
side and replayed through kdeval's rule.

kvpress' CAMPress never evicts during the prefill: every ``compression_interval`` decode steps it cuts the cache to
``target_size``, its running attention sum ``A`` counting the decode queries only, and merges at most as many
freed tokens as steps ran since its last compression. kdeval holds its budget from the first chunk and counts every
query. So the comparison is of one step: kvpress prefills the essays' first ``L - D`` tokens and decodes the next
``D`` of them one at a time (teacher forced), around ``KnormPress``, with ``compression_interval = D`` and
``target_size = N``: at the ``D``-th step each layer holds ``L`` tokens, frees ``L - N = D`` and may merge ``D``
(the cap does not bind: every freed token is a candidate, as in kdeval). That step's inputs (keys, values, ``A``,
KnormPress' scores) and outputs (the kept keys and merged values, the ``torch.bernoulli`` mask) are recorded.

Rows (all 30 layers x 3 KV heads; ``N = 500`` of ``L = 1000``, ``merge_budget = 32``):

1. kdeval's selection (the head-mean of knorm's scores, equal scores oldest first) and ``merge_into_windows`` on
   kvpress' recorded keys, values and ``A``, the draws reproducing kvpress' mask (0 where it merged, 1 where not);
2. the same with kdeval's own hashed draws (seed 0): the one difference left is the draw;
3. kdeval's engine end to end, one chunk of the ``L`` tokens, budget ``N``: its own keys, its own ``A`` (every
   query of the chunk) and its hashed draws (its merges counted by replaying its recorded ``A`` on the prompt's
   keys and values, checked against its merged values).

"p = 1": the freed tokens whose merge probability ``clamp(A / window mean, 0, 1)`` is 1 under that row's ``A``.
The kvpress side runs in the virtualenv of bench/kvpress_parity.py.

    python bench/cam_parity.py                      # prints the table
    python bench/cam_parity.py --kvpress-out FILE   # keeps kvpress' recording in FILE, reuses it if it exists
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvpress_parity import L, QUIET, agreement, kvpress_python, match_rows, prompt_ids

N, D, M = 500, 500, 32  # kept tokens, decode steps before kvpress' compression (= L - N), merge budget
ONE_BELOW = 1 - 2 ** -24  # the largest float32 below 1: a draw only p = 1 beats


# ---------------------------------------------------------------- kvpress side (its own virtualenv)


def kvpress_side(model_dir: str, ids_file: str, out_file: str) -> None:
    """Prefill ``L - D`` tokens, decode ``D`` under ``CAMPress(KnormPress)``; save per layer its compression step's
    inputs, its kept keys and merged values, and its Bernoulli mask."""
    from importlib.metadata import version

    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    ids = torch.load(ids_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    press = kvpress.CAMPress(base_press=kvpress.KnormPress(), compression_interval=D, target_size=N,
                             hidden_states_buffer_size=0, merge_budget=M)
    compress, real_bernoulli, layers = press.compress, torch.bernoulli, {}

    def recording(module, hidden_states, keys, values, attentions, kw):
        rec = {"keys": keys.clone(), "values": values.clone(), "attention": attentions.clone(),
               "scores": press.base_press.score(module, hidden_states, keys, values, None, kw).clone(),
               "cap": press.layer_step_counts[module.layer_idx]}

        def bernoulli(p, *args, **kwargs):
            rec["mask"] = real_bernoulli(p, *args, **kwargs)
            return rec["mask"]

        torch.bernoulli = bernoulli
        try:
            k2, v2 = compress(module, hidden_states, keys, values, attentions, kw)
        finally:
            torch.bernoulli = real_bernoulli
        rec["kept_keys"], rec["kept_values"] = k2.clone(), v2.clone()
        assert module.layer_idx not in layers, "one compression per layer expected"
        layers[module.layer_idx] = rec
        return k2, v2

    press.compress = recording
    torch.manual_seed(0)
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(ids[:, : L - D], past_key_values=cache)
        for t in range(L - D, L):
            model(ids[:, t: t + 1], past_key_values=cache)
    assert sorted(layers) == list(range(len(model.model.layers))), sorted(layers)
    torch.save({"versions": {"kvpress": version("kvpress"), "transformers": transformers.__version__,
                             "torch": str(torch.__version__)}, "layers": [layers[i] for i in sorted(layers)]},
               out_file)


# ---------------------------------------------------------------- kdeval side


def replay(layer: int, keys: torch.Tensor, values: torch.Tensor, attention: torch.Tensor, draws) -> tuple:
    """kdeval's CaM step (around knorm) on one layer's whole cache, ``keys``/``values [1, h, L, d]`` at slots =
    positions, ``attention [1, h, L]``: its selection at budget ``N``, then ``merge_into_windows`` with
    ``draws(positions)``. Returns the kept mask ``[h, L]`` and the merged values ``[h, L, d]``."""
    from kdeval.baselines import get_policy
    from kdeval.baselines.cam import merge_into_windows
    from kdeval.keydiff.policy.interface import Freed, ScoreContext
    from kdeval.keydiff.policy.selection import Selector

    policy = get_policy("cam", inner="knorm", merge_budget=M)
    h, n = keys.shape[1], keys.shape[2]
    ctx = ScoreContext(layer, torch.arange(n).view(1, 1, n).expand(1, h, n).clone(), n, 1)
    slots = Selector(policy, policy.needs().exact_ties).free(keys, ctx, n - N, N)
    kept = torch.ones(1, h, n, dtype=torch.bool).scatter_(-1, slots, False)
    merged = values.clone()
    merge_into_windows(Freed(merged, slots, kept), ctx, attention, M, draws)
    return kept[0], merged[0]


def decisions(layer: int, keys: torch.Tensor, attention: torch.Tensor, draws) -> torch.Tensor:
    """Which tokens merge in :func:`replay` ``[h, L]`` bool: each freed token's value a one-hot channel of its own
    (float64, 250 channels a pass), it merged if its channel reaches the kept tokens (a token with no kept token
    after it merges into nothing)."""
    h = keys.shape[1]
    kept, _ = replay(layer, keys, torch.zeros(1, h, L, 1), attention, draws)
    freed = (~kept).any(0).nonzero().flatten()
    out = torch.zeros(h, L, dtype=torch.bool)
    for part in freed.split(250):
        onehot = torch.zeros(1, h, L, len(part), dtype=torch.float64)
        onehot[0, :, part, torch.arange(len(part))] = 1
        kept, merged = replay(layer, keys, onehot, attention, draws)
        out[:, part] = ((merged * kept.unsqueeze(-1)).sum(1) > 0.5) & ~kept[:, part]
    return out


def freed_positions(kept: torch.Tensor) -> torch.Tensor:
    """The positions not in ``kept [h, N]`` (sorted per head) → ``[h, L - N]`` in position order."""
    h = kept.shape[0]
    return torch.ones(h, L, dtype=torch.bool).scatter_(-1, kept, False).nonzero()[:, 1].view(h, -1)


def mask_draws(kept: torch.Tensor, mask: torch.Tensor):
    """Draws reproducing kvpress' Bernoulli ``mask [h, k]`` over its freed tokens (the complement of ``kept [h, N]``
    positions, in position order): 0 where it merged, 1 elsewhere."""
    positions = freed_positions(kept)
    assert positions.shape == mask.shape, (positions.shape, mask.shape)
    table = torch.ones(kept.shape[0], L + 1).scatter_(-1, positions, 1 - mask.float())
    return lambda at: table.unsqueeze(0).gather(-1, at.clamp(max=L))


def kvpress_decisions(kept: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """kvpress' merges that reach a kept token ``[h, L]`` bool, and how many of its mask's ones have no kept
    token after them (their share of the window, ``mask / 0``, is zeroed: they merge into nothing)."""
    drawn = torch.zeros(kept.shape[0], L, dtype=torch.bool).scatter_(-1, freed_positions(kept), mask.bool())
    windowed = drawn & (torch.arange(L) < kept.max(-1, keepdim=True).values)
    return windowed, int(drawn.sum() - windowed.sum())


def engine_run(lm, ids: torch.Tensor) -> tuple[list, list, list]:
    """kdeval's engine, ``cam`` around knorm, one chunk of ``L`` at budget ``N``: kept positions and merged values
    per layer (``ours_kept``) and the running attention ``A`` the merge read ``[1, h, L]`` by position."""
    import kdeval.baselines.cam as cam
    from kvpress_parity import ours_kept

    seen_a, real = [], cam.merge_into_windows

    def recording(freed, ctx, attention, merge_budget, draws):
        assert int(ctx.seen) == L
        a = torch.zeros(attention.shape[:2] + (L,))
        ok = ctx.positions < L
        for head in range(a.shape[1]):
            a[0, head, ctx.positions[0, head][ok[0, head]]] = attention[0, head][ok[0, head]].float()
        seen_a.append(a)
        return real(freed, ctx, attention, merge_budget, draws)

    cam.merge_into_windows = recording
    try:
        kept, _, values = ours_kept(lm, ids, dict(ours=("cam", {"inner": "knorm", "merge_budget": M}), n=N))
    finally:
        cam.merge_into_windows = real
    assert len(seen_a) == len(kept), "one merge per layer expected"
    return kept, values, seen_a


def run(reuse: str | None) -> None:
    from kdeval.baselines.cam import hashed_draws
    from kdeval.zoo import load_model
    from kdeval.zoo.loading import smollm2_safetensors_dir

    t0 = time.perf_counter()
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    ids = prompt_ids(lm.tokenizer)
    assert ids.shape[1] == L
    python = kvpress_python()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(reuse) if reuse else Path(tmp) / "cam.pt"
        if not out.exists():
            ids_file = Path(tmp) / "ids.pt"
            torch.save(ids, ids_file)
            side = subprocess.run([str(python), __file__, "--kvpress-side", str(smollm2_safetensors_dir()),
                                   str(ids_file), str(out)], env={**os.environ, **QUIET}, capture_output=True,
                                  text=True, timeout=900)
            if side.returncode != 0:
                raise SystemExit(f"the kvpress side failed:\n{side.stderr[-5000:]}")
        theirs = torch.load(out)
    t_kvpress = time.perf_counter()
    recs = theirs["layers"]
    assert all(r["cap"] >= L - N == r["mask"].shape[-1] for r in recs), "kvpress' merge cap binds"
    their_kept = [match_rows(r["keys"][0], r["kept_keys"][0]) for r in recs]
    theirs_dec, windowless = zip(*(kvpress_decisions(k, r["mask"][0]) for k, r in zip(their_kept, recs)))
    with torch.no_grad():
        prompt = lm.model(ids, use_cache=True).past_key_values.layers
    key_diff = max((p.keys - r["keys"]).abs().max().item() for p, r in zip(prompt, recs))
    score_diff = max((-r["keys"].float().norm(dim=-1) - r["scores"]).abs().max().item() for r in recs)
    eng_kept, eng_values, eng_a = engine_run(lm, ids)

    def hashed(li):
        return lambda at: hashed_draws(0, li, at, L)

    def p_one(at):
        return torch.full(at.shape, ONE_BELOW)

    def row(label: str, a_over: str, layers: list, draws, a_p1: list | None = None) -> tuple:
        """``layers``: per layer (keys, values, A) replayed with ``draws(layer)``; the kept sets, merges, share
        with p = 1 and merged values against kvpress'."""
        kept, values, dec, p1 = [], [], [], []
        for li, (k, v, a) in enumerate(layers):
            mask, merged = replay(li, k, v, a, draws(li))
            kept.append(mask.nonzero()[:, 1].view(mask.shape[0], -1))
            values.append(torch.stack([merged[h, kept[-1][h]] for h in range(mask.shape[0])]))
            dec.append(decisions(li, k, a, draws(li)))
            p1.append(int(decisions(li, k, a, p_one).sum()) if a_p1 is None else a_p1[li])
        got = agreement(kept, their_kept)
        diffs = [(v[h] - r["kept_values"][0, h]).abs().max().item() for k, v, tk, r in
                 zip(kept, values, their_kept, recs) for h in range(len(k)) if torch.equal(k[h], tk[h])]
        same = [(d == t).gather(-1, freed_positions(tk)) for d, t, tk in zip(dec, theirs_dec, their_kept)]
        return label, a_over, dict(got, merged=sum(int(d.sum()) for d in dec), p1=p1,
                                   same=100 * torch.cat(same).float().mean().item(), diff=max(diffs),
                                   compared=len(diffs))

    recorded = [(r["keys"], r["values"], r["attention"]) for r in recs]
    rows = [row("kvpress' keys, values and A; kvpress' Bernoulli mask", "decode queries", recorded,
                lambda li: mask_draws(their_kept[li], recs[li]["mask"][0]))]
    rows.append(row("kvpress' keys, values and A; kdeval's hashed draws (seed 0)", "decode queries", recorded,
                    hashed, rows[0][2]["p1"]))
    # the engine's merges replayed from its recorded A on the prompt cache, checked against its merged values
    rows.append(row("kdeval's engine, one chunk of 1000; hashed draws", "every query of the chunk",
                    [(p.keys, p.values, a) for p, a in zip(prompt, eng_a)], hashed))
    replay_diff = 0.0
    for li, (p, a, k, v) in enumerate(zip(prompt, eng_a, eng_kept, eng_values)):
        _, merged = replay(li, p.keys, p.values, a, hashed(li))
        replay_diff = max(replay_diff, max((merged[h, k[h]] - v[h]).abs().max().item() for h in range(len(k))))
    freed = sum(r["mask"].numel() for r in recs)
    their_merges = sum(int(d.sum()) for d in theirs_dec)
    scale = max(r["kept_values"].abs().max().item() for r in recs)
    versions = theirs["versions"]
    lines = [
        f"`python bench/cam_parity.py`: SmolLM2-135M-Instruct (offline), float32, CPU; the essays' first {L} tokens; "
        f"kvpress {versions['kvpress']} (transformers {versions['transformers']}) prefills {L - D} and decodes "
        f"{D} under `CAMPress(KnormPress)` (compression_interval {D}, target_size {N}, merge_budget {M}), which "
        f"compresses once per layer at the {D}th step, {L} tokens to {N}, every freed token a merge candidate "
        f"(cap {D}); torch {versions['torch']}. kvpress' keys (prefill + decode) differ from kdeval's one-pass "
        f"prompt keys by at most {key_diff:.1e}; kvpress' KnormPress scores from -|k| by {score_diff:.1e}. "
        f"{freed} freed tokens in all (30 layers x 3 KV heads x {L - N}); values up to {scale:.1f}.",
        "",
        "| kdeval side | A summed over | kept sets: agreement % (mean) | identical heads | freed tokens merged "
        "(kdeval / kvpress) | same merge decision as kvpress | freed with p = 1 | merged values: max abs diff "
        "(identical heads) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, a_over, got in rows:
        lines.append(f"| {label} | {a_over} | {got['mean']:.2f} | {got['identical']}/{got['heads']} | "
                     f"{got['merged']} / {their_merges} | {got['same']:.2f}% | {100 * sum(got['p1']) / freed:.1f}% | "
                     f"{got['diff']:.1e} ({got['compared']} heads) |")
    lines += ["", f"kvpress' mask also holds {sum(windowless)} ones for freed tokens with no kept token after "
                  f"them, whose share of an empty window is zeroed (they merge into nothing; kdeval draws no merge "
                  f"for them); they are left out of its count. The engine's merged values equal its merges "
                  f"replayed from its recorded A on a plain forward's prompt cache within {replay_diff:.1e}. "
                  f"Wall time: {time.perf_counter() - t0:.0f} s (kvpress side and model load "
                  f"{t_kvpress - t0:.0f} s)."]
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvpress-out", metavar="FILE", help="keep kvpress' recording in FILE; reuse it if it exists")
    ap.add_argument("--kvpress-side", nargs=3, metavar=("MODEL_DIR", "IDS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kvpress_side:
        kvpress_side(*args.kvpress_side)
    else:
        run(args.kvpress_out)


if __name__ == "__main__":
    sys.exit(main())
