"""KeyDiff on multi-head latent attention (MLA): score the cached latent row, or the keys the model expands from it?

An MLA layer caches, per token, a compressed latent (``kv_lora_rank`` wide) and one rotary key shared by the heads;
each head's key is ``[kv_b_proj(latent) per head, rotary key]`` (transformers' ``expand_kv``). The engine scores
the cached row (latent ⊕ rotary key, one "head"). The alternative: KeyDiff per head on the expanded keys (cosine
to that head's mean unit key), reduced over heads by the mean. Which keeps more of the attention the model pays?

For each seed, a tiny random DeepSeek-V3 (``random:deepseek-v3-tiny``: 2 layers, 4 heads, rank 32, rotary 8) reads
a prompt of ``--length`` tokens in one eager pass. The last ``--window`` tokens are the queries (the steps a cache
serves next); the tokens before them are the context a policy evicts. For each budget N, each scoring keeps the
N best-scored context tokens of each layer, and the table gives the share of the queries' attention to the
context (every head and query of the window, per layer, then the mean over layers and seeds) that lands on the
kept tokens; the last column is the paired difference of the two scorings (points, ± twice its standard error
over the seed × layer pairs). ``random`` is N / context (what a uniform draw keeps in expectation); ``oracle`` keeps the N tokens
with the most attention (the ceiling). Prompts: random token ids, and the RULER essay haystack as bytes
(``KDEVAL_DATA_DIR``; skipped when absent).

Random weights: at transformers' initialisation (``initializer_range`` 0.02) the attention logits are tiny and the
attention is uniform (the oracle keeps no more than N / context), so nothing can be told apart; ``--init-std``
also draws the weights wider (0.1, 0.3), where attention concentrates. The figures compare the two scorings on
these models, not on a trained one.

    python bench/mla_scoring.py [--seeds 5] [--length 512] [--window 32] [--budgets 32 64 128]
        [--init-std 0.02 0.1 0.3]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from kdeval.keydiff.policy.keydiff import keydiff_scores
from kdeval.zoo.loading import load_model

MODEL = "random:deepseek-v3-tiny"


def _prompts(length: int, seed: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"random ids": torch.randint(3, vocab, (1, length), generator=g)}
    data = Path(os.environ.get("KDEVAL_DATA_DIR", "")) / "haystack" / "PaulGrahamEssays.json"
    if data.is_file():
        text = json.loads(data.read_text())["text"].encode()
        start = int(torch.randint(0, len(text) - length, (1,), generator=g))
        out["essay bytes"] = torch.tensor(list(text[start:start + length]), dtype=torch.long).unsqueeze(0) + 3
    return out


@torch.no_grad()
def layer_scores(model: torch.nn.Module, ids: torch.Tensor, context: int):
    """Per layer: the window's attention to the context ``[heads, window, context]`` and each scoring's scores
    ``[context]`` (higher = keep)."""
    out = model(input_ids=ids, use_cache=True, output_attentions=True)
    per_layer = []
    for i, attn in enumerate(out.attentions):
        cached = out.past_key_values.layers[i]
        latent, rotary = cached.keys[..., :context, :], cached.values[..., :context, :]  # [1, 1, C, rank|rope]
        expanded, _ = model.model.layers[i].self_attn.expand_kv(latent, rotary)  # [1, H, C, nope + rope]
        scores = {
            "latent row (engine)": keydiff_scores(torch.cat([latent, rotary], dim=-1))[0, 0],
            "expanded keys, mean over heads": keydiff_scores(expanded)[0].mean(dim=0),
            "latent only": keydiff_scores(latent)[0, 0],
        }
        per_layer.append((attn[0, :, context:, :context].float(), scores))
    return per_layer


def retained(mass: torch.Tensor, scores: torch.Tensor, n: int) -> float:
    """The share of ``mass [heads, window, context]`` on the ``n`` best-scored context tokens."""
    kept = scores.topk(n).indices
    return (mass[..., kept].sum() / mass.sum()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--init-std", type=float, nargs="+", default=[0.02, 0.1, 0.3])
    args = parser.parse_args()
    context = args.length - args.window
    torch.set_num_threads(1)
    sums: dict[tuple[float, str, str, int], list[float]] = {}
    for std in args.init_std:
        for seed in range(args.seeds):
            lm = load_model(MODEL, device="cpu", attn_implementation="eager", seed=seed,
                            overrides={"initializer_range": std})
            for prompt, ids in _prompts(args.length, seed, lm.model.config.vocab_size).items():
                for mass, scores in layer_scores(lm.model, ids, context):
                    scores = dict(scores, oracle=mass.sum(dim=(0, 1)))
                    for n in args.budgets:
                        for name, s in scores.items():
                            sums.setdefault((std, prompt, name, n), []).append(retained(mass, s, n))
    prompts = sorted({p for _, p, _, _ in sums}, reverse=True)
    names = ["latent row (engine)", "expanded keys, mean over heads", "latent only", "oracle"]
    print(f"{MODEL}, {args.seeds} seeds, prompt {args.length} tokens: the last {args.window} are the queries, "
          f"{context} context tokens; attention mass kept (% of the window's attention to the context, mean over "
          f"layers and seeds)\n")
    print("| init std | prompt | N | random (N / context) | " + " | ".join(names) + " | row − expanded |")
    print("|---:|---|---:|---:|" + "---:|" * (len(names) + 1))
    for std in args.init_std:
        for prompt in prompts:
            for n in args.budgets:
                cells = [f"{100 * sum(v) / len(v):.1f}" for v in (sums[(std, prompt, name, n)] for name in names)]
                row, expanded = (torch.tensor(sums[(std, prompt, name, n)]) for name in names[:2])
                diff = 100 * (row - expanded)
                se = diff.std() / len(diff) ** 0.5
                print(f"| {std:g} | {prompt} | {n} | {100 * n / context:.1f} | " + " | ".join(cells)
                      + f" | {diff.mean():+.1f} ± {2 * se:.1f} |")


if __name__ == "__main__":
    main()
