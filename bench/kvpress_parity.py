"""Parity with NVIDIA kvpress: the positions each policy keeps, per layer and KV head, beside kvpress' press.

One prompt of ``L`` tokens (Paul Graham's essays from ``$KDEVAL_DATA_DIR``) on the offline SmolLM2-135M in
float32 on the CPU, compressed once: kdeval's engine with one chunk covering the prompt (``B = L``) and budget
``N``, against kvpress' press at ``compression_ratio`` with ``int(L * (1 - ratio)) == N``. Agreement = kept
positions in common / the larger of the two kept counts (``N``, but for per-layer budgets), over the 30 layers x
3 KV heads; "inside" = kept positions in common / the smaller count (100%: the smaller kept set is inside the
larger one, as when one ranking is cut at two budgets); "equal layer totals" = layers whose KV heads keep as many
tokens in all on both sides.

The AdaKV cases (head-adaptive budgets) keep a different number of tokens per head: kvpress' ``AdaKVPress`` keeps
every key and records the pruned ones in ``module.masked_key_indices`` (batch, head, position), so its kept set
per head is the complement; kdeval's per head are the positions of the head pool's slots tagged with that head.
The KVzip cases run on the prompt opened by the chat template's head (kvpress' pipeline always opens a context so,
and ``KVzipPress`` leaves those tokens out of its reconstruction); ``KVzipPress`` masks too (its kept set is the
complement), and its scores themselves (``score_val``) are compared at kdeval's per-head budget.

kvpress pins an older transformers than kdeval, so it runs in its own virtualenv, created once under the kdeval
cache directory (``pip install kvpress==KVPRESS torch==<this torch>``), from the same safetensors directory;
this file is run there with ``--kvpress-side`` (it imports only torch, transformers and kvpress then) and hands
back the kept positions in a ``torch.save`` file. For the re-rotating case (kvpress' ``KeyRerotationPress``) the
kept keys themselves are compared too: both sides re-rotate them to positions ``0 .. N-1``. So are ThinK's
(``ComposedPress([token press, ThinKPress])``): the kept set is the token press' output, the keys ThinK's, and each
head's zeroed channels (zero in every kept key) are compared. For the merging cases (``MergingPress``) the kept
values are compared too, in position order, on the heads whose kept sets agree.

    python bench/kvpress_parity.py            # writes the kvpress section of bench/RESULTS.md
    python bench/kvpress_parity.py --print    # prints the table only
    python bench/kvpress_parity.py --only criticalkv snapkv   # the cases whose id starts so, printed
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
BEGIN, END = "<!-- kvpress:begin -->", "<!-- kvpress:end -->"
KVPRESS = "0.5.5"
L = 1000
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
         "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}

SNAPKV_AS_KVPRESS = {"name": "snapkv", "params": {"window": 64, "kernel": 5, "pooling": "avg"}}

# id, kdeval policy and parameters, kvpress press and arguments, kept tokens N, what differs by construction.
CASES = [
    dict(id="knorm", ours=("knorm", {}), press=("KnormPress", {}), n=500, rule="same rule"),
    dict(id="keydiff", ours=("keydiff", {}), press=("KeyDiffPress", {}), n=500, rule="same rule"),
    dict(id="sink", ours=("sink", {"n_sink_tokens": 4}), press=("StreamingLLMPress", {"n_sink": 4}), n=500,
         rule="same rule (StreamingLLM without re-rotation)"),
    dict(id="snapkv", ours=("snapkv", {"window": 64, "kernel": 5, "pooling": "avg"}),
         press=("SnapKVPress", {"window_size": 64, "kernel_size": 5}), n=500, rule="same rule, kvpress' defaults"),
    dict(id="tova", ours=("tova", {}), press=("TOVAPress", {}), n=500,
         rule="kvpress always keeps the last token and drops its column before ranking; kdeval ranks it too"),
    dict(id="chunkkv", ours=("chunkkv", {"group_size": 10}), press=("ChunkKVPress", {"chunk_length": 10}), n=500,
         rule="inner KeyDiff, groups of 10, shared by the KV heads"),
    dict(id="lagkv", ours=("lagkv", {"lag_size": 128}), press=("LagKVPress", {"lag_size": 128, "n_sink": 4}),
         n=502, rule="kvpress averages the key score with the value score; kdeval scores the keys only"),
    dict(id="lagkv vs kvpress on keys only", ours=("lagkv", {"lag_size": 128}),
         press=("LagKVKeysOnly", {"lag_size": 128, "n_sink": 4}), n=502,
         rule="kvpress' LagKVPress given the keys as values: the same rule"),
    dict(id="expected-attention", ours=("expected-attention", {"query_window": L}), press=("ExpectedAttentionPress", {}),
         n=500, rule="same rule; the query window (1000) covers the prompt"),
    dict(id="sink-rerotate", ours=("sink-rerotate", {"n_sink_tokens": 4}), press=("KeyRerotationPress", {"n_sink": 4}),
         n=500, rule="same rule, `StreamingLLMPress` wrapped in `KeyRerotationPress`; re-rotated keys compared too"),
    dict(id="pyramidkv", ours=("pyramidkv", {"window": 64, "kernel": 5, "pooling": "avg", "beta": 20}),
         press=("PyramidKVPress", {"window_size": 64, "kernel_size": 5, "beta": 20}), n=500,
         rule="SnapKV's scores under other per-layer budgets: kdeval 914 down to 86 (the window on top of a "
              "pyramid of N - window), kvpress 936 down to 64 (the window inside, the top capped at L - window)"),
    dict(id="h2o (recent_fraction=0) vs ObservedAttention", ours=("h2o", {"recent_fraction": 0.0}),
         press=("ObservedAttentionPress", {}), n=500, eager=True,
         rule="different rules: kvpress divides each token's summed attention by the number of queries after it"),
    dict(id="ada-keydiff", ours=("ada-keydiff", {}),
         press=("AdaKVPress", {"press": ("KeyDiffPress", {}), "alpha_safeguard": 0.2}), n=500,
         rule="same rule: a layer's 3 x 500 kept tokens shared among its heads by KeyDiff's scores, each head's "
              "100 best safeguarded; per-head counts differ"),
    dict(id="ada-snapkv", ours=("ada-snapkv", {}),
         press=("AdaKVPress", {"press": ("SnapKVPress", {"window_size": 32, "kernel_size": 7}),
                               "alpha_safeguard": 0.2}), n=500,
         rule="AdaKV around SnapKV at kdeval's defaults (window 32, kernel 7): kdeval pools the scores with max, "
              "kvpress with avg"),
    dict(id="ada-snapkv (inner pooling avg)",
         ours=("ada-snapkv", {"inner": {"name": "snapkv", "params": {"pooling": "avg"}}}),
         press=("AdaKVPress", {"press": ("SnapKVPress", {"window_size": 32, "kernel_size": 7}),
                               "alpha_safeguard": 0.2}), n=500,
         rule="the row above with kdeval's inner SnapKV pooling with avg as kvpress does: the same rule"),
    dict(id="criticalkv", ours=("criticalkv", {"inner": SNAPKV_AS_KVPRESS}),
         press=("CriticalKVPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5})}), n=500,
         rule="SnapKV (kvpress' defaults) as the inner scorer, its best 250 first, the rest by (score + epsilon) x "
              "the value's L1 norm through W_o; epsilon = 1e-4 on both sides, which weighs 64 x less here (next row)"),
    dict(id="criticalkv (epsilon x 64)", ours=("criticalkv", {"inner": SNAPKV_AS_KVPRESS, "epsilon": 64e-4}),
         press=("CriticalKVPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5})}), n=500,
         rule="the row above with epsilon x 64: kdeval's SnapKV sums the 64 window queries' votes where kvpress "
              "averages them (the same ranking alone), so epsilon weighs 64 x less in the row above"),
    dict(id="criticalkv (inner keydiff)", ours=("criticalkv", {"inner": "keydiff"}),
         press=("CriticalKVPress", {"press": ("KeyDiffPress", {})}), n=500,
         rule="same rule around KeyDiff (negative scores: the weighting favours small values' norms)"),
    dict(id="criticaladakv", ours=("criticaladakv", {"inner": SNAPKV_AS_KVPRESS}),
         press=("CriticalAdaKVPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5}),
                                       "alpha_safeguard": 0.2}), n=500,
         rule="AdaKV's head budgets by SnapKV's scores, then the two stages within each head; per-head counts "
              "differ; epsilon weighs 64 x less than in kvpress (SnapKV's votes summed, not averaged)"),
    dict(id="criticaladakv (epsilon x 64)", ours=("criticaladakv", {"inner": SNAPKV_AS_KVPRESS, "epsilon": 64e-4}),
         press=("CriticalAdaKVPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5}),
                                       "alpha_safeguard": 0.2}), n=500,
         rule="the row above with epsilon x 64: the same rule"),
    dict(id="cur", ours=("cur", {}), press=("CURPress", {}), n=500,
         rule="same rule (key x value leverage over windows of 16, 4 sinks)"),
    dict(id="cur (kv_avg, no local windows)", ours=("cur", {"leverage_type": "kv_avg", "use_local_approximation": False}),
         press=("CURPress", {"leverage_type": "kv_avg", "use_local_approximation": False}), n=500,
         rule="same rule: the mean of the squared key and value norms; 1 kept token differs on 1 head: kdeval "
              "rounds scores to 16 significant bits (a repeated token's scores tie exactly), so two scores kvpress "
              "tells apart tie and go oldest first (90/90 identical without the rounding)"),
    dict(id="leverage", ours=("leverage", {}), press=("LeverageScorePress", {}), n=500, sketch=True,
         rule="same rule and the same Gaussian sketch (kvpress' draw replaced by kdeval's seeded one); kdeval takes "
              "the keys before RoPE by rotating the cached keys back, kvpress from k_proj; 1 kept token differs on "
              "2 heads: scores rounded to 16 significant bits tie where kvpress' differ (90/90 identical without "
              "the rounding)"),
    dict(id="compactor", ours=("compactor", {"query_window": L}), press=("CompactorPress", {}), n=500, sketch=True,
         rule="same rule, kvpress' defaults (sinks 8 + 4, tiles of 256, blending = the compression ratio) and one "
              "Gaussian sketch; the query window (1000) covers the prompt"),
    dict(id="finch", ours=("finch", {"window": 64}), press=("FinchPress", {"window_size": 64}), n=500,
         rule="same rule with the window fixed at the prompt's last 64 tokens (kvpress' window is the question "
              "after its delimiter token, set here directly; kdeval is not told where a question starts); kept keys "
              "re-rotated on both sides and compared too"),
    dict(id="think (inner snapkv)", ours=("think", {"inner": SNAPKV_AS_KVPRESS, "key_channel_ratio": 0.5}),
         press=("ComposedPress", {"presses": [("SnapKVPress", {"window_size": 64, "kernel_size": 5}),
                                              ("ThinKPress", {"key_channel_compression_ratio": 0.5})]}), n=500,
         rule="same rule: SnapKV (kvpress' defaults) keeps the tokens, then ThinK (window 32) zeroes half of each "
              "head's key channels over the kept keys; kept keys compared too"),
    dict(id="think (inner keydiff)", ours=("think", {"inner": "keydiff", "key_channel_ratio": 0.5}),
         press=("ComposedPress", {"presses": [("KeyDiffPress", {}),
                                              ("ThinKPress", {"key_channel_compression_ratio": 0.5})]}), n=500,
         rule="same rule around KeyDiff; kept keys compared too"),
    dict(id="merging", ours=("merging", {"inner": "knorm"}), press=("MergingPress", {"press": ("KnormPress", {})}),
         n=500, values=True,
         rule="same rule: KNorm's evicted tokens folded into their most key-similar kept token's value; merged "
              "values compared too"),
    dict(id="merging (snapkv, merge_fraction=0.75)",
         ours=("merging", {"inner": SNAPKV_AS_KVPRESS, "merge_fraction": 0.75}),
         press=("MergingPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5}),
                                 "merge_fraction": 0.75}), n=500, values=True,
         rule="same rule around SnapKV (kvpress' defaults), the most similar 75% of each head's evicted tokens "
              "merged; merged values compared too"),
    dict(id="kvzip", ours=("kvzip", {}), press=("KVzipScores", {}), n=500, chat=True,
         rule="same rule: kvpress' `KVzipPress` scores (its `score_val`, the 4 sinks raised) cut at the best N per "
              "KV head, as kdeval keeps; the prompt opens with the chat template's head (as kvpress' pipeline builds "
              "it), which neither side reconstructs"),
    dict(id="kvzip vs KVzipPress(layerwise=True)", ours=("kvzip", {}), press=("KVzipPress", {"layerwise": True}),
         n=500, chat=True,
         rule="the same scores under other budgets: kvpress keeps a layer's best 3 x N across its KV heads, kdeval N "
              "per head (its head-shared pool keeps no per-token state); per-head counts differ"),
    dict(id="kvzip vs KVzipPress (default)", ours=("kvzip", {}), press=("KVzipPress", {}), n=500, chat=True,
         rule="kvpress' default (`layerwise=False`) keeps the best 30 x 3 x N across all layers and heads; kdeval's "
              "per-layer budgets are fixed before the first step, so it keeps N per head; layer totals differ"),
]


# ---------------------------------------------------------------- kvpress side (its own virtualenv)


def kvpress_side(model_dir: str, ids_file: str, out_file: str) -> None:
    """Run every case's press on the prompt; save per case and layer the kept positions ``[h, N]``."""
    from importlib.metadata import version

    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    class LagKVKeysOnly(kvpress.LagKVPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return super().score(module, hidden_states, keys, keys, attentions, kwargs)

    prompts = torch.load(ids_file)
    ids = prompts["plain"]
    models = {}

    # The leverage presses draw their Gaussian sketch from the global generator; a case with ``sketch`` draws
    # kdeval's instead (kdeval/baselines/leverage.py: per layer, from torch.Generator seeded 0 * 100003 + layer,
    # [heads, d, k] scaled by 1/sqrt(k), the same for every row), so the rule is compared on one sketch.
    real_randn, sketch_layer = torch.randn, {}

    def seeded_randn(*shape, **kw):
        if "layer" not in sketch_layer or len(shape) != 4:
            return real_randn(*shape, **kw)
        b, h, d, k = shape
        g = torch.Generator().manual_seed(sketch_layer["layer"])
        return real_randn(h, d, k, generator=g).expand(b, h, d, k).to(kw.get("dtype") or torch.float32)

    def sketched(scorer):
        score = scorer.score

        def with_sketch(module, *args, **kwargs):
            sketch_layer["layer"] = module.layer_idx
            try:
                return score(module, *args, **kwargs)
            finally:
                sketch_layer.clear()
        scorer.score = with_sketch

    def model_for(eager: bool):
        impl = "eager" if eager else "sdpa"
        if impl not in models:
            models[impl] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                                attn_implementation=impl).eval()
        return models[impl]

    out = {"versions": {"kvpress": version("kvpress"), "transformers": transformers.__version__,
                        "torch": str(torch.__version__)}, "cases": {}}
    with torch.no_grad():
        cache = DynamicCache()
        model_for(False)(ids, past_key_values=cache)
        out["keys"] = [layer.keys.clone() for layer in cache.layers]
    for case in CASES:
        name, kwargs = case["press"]
        ratio = 1 - case["n"] / L
        if name == "AdaKVPress":
            inner, inner_kwargs = kwargs["press"]
            press = kvpress.AdaKVPress(press=getattr(kvpress, inner)(compression_ratio=ratio, **inner_kwargs),
                                       alpha_safeguard=kwargs["alpha_safeguard"])
        elif name == "ChunkKVPress":
            press = kvpress.ChunkKVPress(press=kvpress.KeyDiffPress(compression_ratio=ratio), **kwargs)
        elif name in ("CriticalKVPress", "CriticalAdaKVPress", "MergingPress"):
            inner, inner_kwargs = kwargs["press"]
            rest = {k: v for k, v in kwargs.items() if k != "press"}
            press = getattr(kvpress, name)(press=getattr(kvpress, inner)(compression_ratio=ratio, **inner_kwargs),
                                           **rest)
        elif name == "KeyRerotationPress":
            press = kvpress.KeyRerotationPress(press=kvpress.StreamingLLMPress(compression_ratio=ratio, **kwargs))
        elif name == "ComposedPress":  # a token press, then ThinKPress
            (token, token_kwargs), (think, think_kwargs) = kwargs["presses"]
            press = kvpress.ComposedPress([getattr(kvpress, token)(compression_ratio=ratio, **token_kwargs),
                                           getattr(kvpress, think)(**think_kwargs)])
        elif name in ("KVzipPress", "KVzipScores"):  # its scores kept before it picks the pruned indices
            press = kvpress.KVzipPress(compression_ratio=ratio, **kwargs)
            kvzip_scores: dict[str, torch.Tensor] = {}

            def keep_scores(model, post=press.compress_post, press=press, into=kvzip_scores):
                into["val"] = press.score_val.clone()  # [layers, 1, heads, L]
                return post(model)
            press.compress_post = keep_scores
        elif name == "FinchPress":  # the window the delimiter hook would set, set directly (no delimiter token)
            press = kvpress.FinchPress(compression_ratio=ratio)
            press.window_size = kwargs["window_size"]
        else:
            cls = LagKVKeysOnly if name == "LagKVKeysOnly" else getattr(kvpress, name)
            press = cls(compression_ratio=ratio, **kwargs)
        kept: dict[int, torch.Tensor] = {}
        kept_keys: dict[int, torch.Tensor] = {}
        kept_values: dict[int, torch.Tensor] = {}
        compress = press.compress

        def recording(module, hidden_states, keys, values, attentions, kw, compress=compress, kept=kept, press=press,
                      kept_values=kept_values):
            k2, v2 = compress(module, hidden_states, keys, values, attentions, kw)
            if isinstance(press, kvpress.MergingPress):  # keys untouched: the kept rows found by their keys; the
                # merged values in position order
                rows = match_rows(keys[0], k2[0], ordered=False)
                order = rows.argsort(-1).unsqueeze(-1).expand(-1, -1, v2.shape[-1])
                kept[module.layer_idx] = rows.sort(-1).values
                kept_values[module.layer_idx] = v2[0].gather(1, order).clone()
                return k2, v2
            if isinstance(press, (kvpress.KeyRerotationPress, kvpress.FinchPress)):  # new keys: the kept set is
                # the scores' top N
                scorer = press.press if isinstance(press, kvpress.KeyRerotationPress) else press
                scores = scorer.score(module, hidden_states, keys, values, attentions, kw)
                kept[module.layer_idx] = scores[0].topk(k2.shape[2], dim=-1).indices.sort(-1).values
                kept_keys[module.layer_idx] = k2[0].clone()
            elif isinstance(press, (kvpress.AdaKVPress, kvpress.CriticalAdaKVPress)):  # nothing removed: the kept
                # set is the unmasked keys
                _, heads, positions = module.masked_key_indices
                keep = torch.ones(keys.shape[1], keys.shape[2], dtype=torch.bool)
                keep[heads, positions] = False
                kept[module.layer_idx] = [row.nonzero().flatten() for row in keep]
            else:
                kept[module.layer_idx] = match_rows(keys[0], k2[0])
            return k2, v2

        if name == "ComposedPress":
            record_composed(press, kept, kept_keys)
        else:
            press.compress = recording
        if case.get("sketch"):
            sketched(getattr(press, "_leverage_press", press))
            torch.randn = seeded_randn
        t0 = time.perf_counter()
        # FinchPress' own context also hooks the embeddings to find its delimiter token: the base press' hooks only
        hooks = kvpress.presses.base_press.BasePress.__call__ if name == "FinchPress" else type(press).__call__
        with torch.no_grad(), hooks(press, model_for(case.get("eager", False))):
            model_for(case.get("eager", False))(prompts["chat" if case.get("chat") else "plain"],
                                                past_key_values=DynamicCache())
        torch.randn = real_randn
        if name == "KVzipScores":  # the best N per KV head of kvpress' scores (sinks raised as kvpress does)
            val = kvzip_scores["val"].clone()
            val[..., : press.n_sink] = float("inf")
            kept = {i: val[i, 0].topk(case["n"], dim=-1).indices.sort(-1).values for i in range(val.shape[0])}
        elif name == "KVzipPress":  # nothing removed: the kept set is the unmasked keys
            n_heads = kvzip_scores["val"].shape[2]
            for layer in model_for(False).model.layers:
                _, heads, positions = layer.self_attn.masked_key_indices
                keep = torch.ones(n_heads, L, dtype=torch.bool)
                keep[heads, positions] = False
                kept[layer.self_attn.layer_idx] = [row.nonzero().flatten() for row in keep]
        out["cases"][case["id"]] = {"kept": [kept[i] for i in sorted(kept)], "s": time.perf_counter() - t0,
                                    "keys": [kept_keys[i] for i in sorted(kept_keys)],
                                    "values": [kept_values[i] for i in sorted(kept_values)]}
    torch.save(out, out_file)


def match_rows(before: torch.Tensor, after: torch.Tensor, ordered: bool = True) -> torch.Tensor:
    """Per head, the indices of ``after [h, N, d]``'s rows in ``before [h, L, d]`` (exact copies, matched by
    their bytes) → ``[h, N]`` sorted (``ordered=False``: in ``after``'s row order)."""
    rows = []
    for b, a in zip(before.contiguous().numpy(), after.contiguous().numpy()):
        where = {row.tobytes(): i for i, row in enumerate(b)}
        found = [where[row.tobytes()] for row in a]  # a KeyError: a kept key is no prompt key
        rows.append(sorted(found) if ordered else found)
    return torch.tensor(rows)


def record_composed(press, kept: dict, kept_keys: dict) -> None:
    """Record a ``ComposedPress([token press, ThinKPress])`` per layer: the token press' kept positions ``[h, N]``
    and the keys ThinK leaves (zeroed channels) ``[h, N, d]`` in position order."""
    token, think = press.presses
    token_compress, think_compress = token.compress, think.compress
    order: dict[int, torch.Tensor] = {}

    def token_recording(module, hidden_states, keys, values, attentions, kw):
        k2, v2 = token_compress(module, hidden_states, keys, values, attentions, kw)
        rows = match_rows(keys[0], k2[0], ordered=False)
        kept[module.layer_idx], order[module.layer_idx] = rows.sort(-1)
        return k2, v2

    def think_recording(module, hidden_states, keys, values, attentions, kw):
        k2, v2 = think_compress(module, hidden_states, keys, values, attentions, kw)
        index = order[module.layer_idx].unsqueeze(-1).expand(-1, -1, k2.shape[-1])
        kept_keys[module.layer_idx] = k2[0].gather(1, index).clone()  # ThinK zeroes the cache's keys in place
        return k2, v2

    token.compress, think.compress = token_recording, think_recording


# ---------------------------------------------------------------- kdeval side


def kvpress_python() -> Path:
    """The kvpress virtualenv's interpreter, created on first use (about a minute with the wheels cached)."""
    from kdeval.zoo.loading import cache_dir

    venv = cache_dir() / f"kvpress-{KVPRESS}-venv"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if not done.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        torch_pin = torch.__version__.split("+")[0]
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", f"kvpress=={KVPRESS}", f"torch=={torch_pin}"],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            raise SystemExit(f"kvpress could not be installed in {venv}:\n{pip.stderr[-3000:]}")
        done.write_text(f"kvpress=={KVPRESS} torch=={torch_pin}\n")
    return python


def prompt_ids(tokenizer, chat: bool = False) -> torch.Tensor:
    """The essays' first ``L`` tokens; ``chat``: the chat template's head (system prompt, user header) first, as
    kvpress' pipeline opens a context (the KVzip cases: kvpress does not reconstruct those tokens)."""
    from kdeval.evals.tasks.data import require_data_file
    from kdeval.keydiff.attention.repeat_prompt import RepeatPrompt

    path = require_data_file(None, "haystack/PaulGrahamEssays.json", "It ships in the shared data directory.")
    text = json.loads(path.read_text())["text"]
    ids = tokenizer(text, return_tensors="pt").input_ids
    if not chat:
        return ids[:, :L]
    head = torch.tensor([RepeatPrompt.from_tokenizer(tokenizer).head])
    return torch.cat([head, ids[:, : L - head.shape[1]]], dim=1)


def ours_kept(lm, ids: torch.Tensor, case: dict, chat_ids: torch.Tensor | None = None) -> tuple[list, list, list]:
    """kdeval's kept positions per layer ``[h, N]`` (sorted), their keys ``[h, N, d]`` and values in that order, one
    chunk covering the prompt (``chat_ids`` for a case with ``chat``). A head pool (AdaKV) gives per layer a list
    of ``h`` sorted position tensors (one per KV head, of its own length) and no keys nor values."""
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.keydiff.attention.repeat_prompt import RepeatPrompt

    name, params = case["ours"]
    policy = get_policy(name, **params)
    repeat = RepeatPrompt.from_tokenizer(lm.tokenizer) if policy.needs().repeat is not None else None
    state = Engine(lm.model, policy, EngineConfig(budget=case["n"], chunk_size=L), repeat_prompt=repeat).prefill(
        chat_ids if case.get("chat") else ids)
    kept, keys, values = [], [], []
    for layer in state.cache.layers:
        if hasattr(layer, "tags"):  # head pool: whose each filled slot is
            tags, positions = layer.tags[0, 0, : layer.slots], layer.positions[0, 0, : layer.slots]
            kept.append([positions[tags == h].sort().values for h in range(layer.heads)])
            continue
        k, positions, _ = layer.view()
        order = positions[0].argsort(-1)
        kept.append(positions[0].gather(-1, order))
        keys.append(k[0].gather(1, order.unsqueeze(-1).expand(-1, -1, k.shape[-1])))
        v = layer.values[0, :, : k.shape[2]]
        values.append(v.gather(1, order.unsqueeze(-1).expand(-1, -1, v.shape[-1])))
    return kept, keys, values


def merged_values_note(kept: list, values: list, side: dict, prompt_cache) -> str:
    """How the kept values of a merging case compare, on the heads whose kept sets are identical: the largest
    difference between the two sides, the values' scale, and the share of kept tokens merged into (their value no
    longer the prompt's)."""
    diffs, scale, merged, total = [], 0.0, 0, 0
    for li, (pos, ours, theirs) in enumerate(zip(kept, values, side["values"])):
        prompt_values = prompt_cache[li].values[0]  # [h, L, d]
        for h in range(pos.shape[0]):
            if not torch.equal(pos[h], side["kept"][li][h]):
                continue
            diffs.append((ours[h] - theirs[h]).abs().max().item())
            scale = max(scale, theirs[h].abs().max().item())
            merged += int((ours[h] != prompt_values[h, pos[h]]).any(-1).sum())
            total += pos.shape[1]
    return (f" (merged values differ by at most {max(diffs):.1e} on the {len(diffs)} identical heads, values up to "
            f"{scale:.1f}; {100 * merged / total:.1f}% of the kept tokens merged into)")


def agreement(ours: list, theirs: list) -> dict:
    """Per layer, ``ours``/``theirs`` hold one kept-position tensor per KV head (rows of ``[h, N]`` or a list)."""
    pairs = [(set(a.tolist()), set(b.tolist())) for lo, lt in zip(ours, theirs) for a, b in zip(lo, lt)]
    totals = [sum(len(a) for a in lo) == sum(len(b) for b in lt) for lo, lt in zip(ours, theirs)]
    shares = [len(a & b) / max(len(a), len(b)) for a, b in pairs]
    inside = [len(a & b) / min(len(a), len(b)) for a, b in pairs]
    return {"mean": 100 * sum(shares) / len(shares), "min": 100 * min(shares), "inside": 100 * sum(inside) / len(inside),
            "identical": sum(a == b for a, b in pairs), "heads": len(shares), "totals": sum(totals),
            "layers": len(totals)}


def run(print_only: bool, reuse: str | None) -> None:
    from kdeval.zoo import load_model
    from kdeval.zoo.loading import smollm2_safetensors_dir

    t0 = time.perf_counter()
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    ids, chat_ids = prompt_ids(lm.tokenizer), prompt_ids(lm.tokenizer, chat=True)
    assert ids.shape[1] == L == chat_ids.shape[1], f"the essays give {ids.shape[1]} tokens, need {L}"
    for case in CASES:
        assert int(L * (1 - (1 - case["n"] / L))) == case["n"], case["id"]
    python = kvpress_python()
    t_venv = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(reuse) if reuse else Path(tmp) / "kvpress.pt"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            ids_file = Path(tmp) / "ids.pt"
            torch.save({"plain": ids, "chat": chat_ids}, ids_file)
            only = ["--only", *[c["id"] for c in CASES]]
            side = subprocess.run([str(python), __file__, "--kvpress-side", str(smollm2_safetensors_dir()),
                                   str(ids_file), str(out), *only], env={**os.environ, **QUIET}, capture_output=True,
                                  text=True, timeout=900)
            if side.returncode != 0:
                raise SystemExit(f"the kvpress side failed:\n{side.stderr[-5000:]}")
        theirs = torch.load(out)
    t_kvpress = time.perf_counter()
    with torch.no_grad():
        prompt_cache = lm.model(ids, use_cache=True).past_key_values.layers
    mine = [layer.keys for layer in prompt_cache]
    key_diff = max((a - b).abs().max().item() for a, b in zip(mine, theirs["keys"]))
    rows = []
    for case in CASES:
        kept, keys, values = ours_kept(lm, ids, case, chat_ids)
        side = theirs["cases"][case["id"]]
        got = agreement(kept, side["kept"])
        rule = case["rule"]
        if side.get("keys"):
            diff = max((a - b).abs().max().item() for a, b in zip(keys, side["keys"]))
            scale = max(b.abs().max().item() for b in side["keys"])
            rule += f" (kept keys differ by at most {diff:.1e}, keys up to {scale:.0f})"
            zeroed = [((a == 0).all(0), (b == 0).all(0)) for la, lb in zip(keys, side["keys"]) for a, b in zip(la, lb)]
            if any(b.any() for _, b in zeroed):  # ThinK: each head's zeroed key channels
                same = sum(torch.equal(a, b) for a, b in zeroed)
                rule += (f"; zeroed channels identical on {same}/{len(zeroed)} heads "
                         f"({int(zeroed[0][1].sum())} of {zeroed[0][1].numel()} per head)")
        if case.get("values"):
            rule += merged_values_note(kept, values, side, prompt_cache)
        rows.append((dict(case, rule=rule), got))
    versions = theirs["versions"]
    lines = [
        f"`python bench/kvpress_parity.py`: SmolLM2-135M-Instruct (offline), float32, CPU; one prompt of {L} tokens "
        f"(Paul Graham's essays), one chunk (B = {L}); kvpress {versions['kvpress']} with transformers "
        f"{versions['transformers']} in its own virtualenv, kdeval with transformers "
        f"{__import__('transformers').__version__}; torch {versions['torch']}. The two stacks' prompt keys differ by "
        f"at most {key_diff:.2e}. Agreement: kept positions in common / the larger kept count (N but for per-layer "
        f"budgets), over 30 layers x 3 KV heads; inside: in common / the smaller count; equal layer totals: layers "
        f"whose heads keep as many tokens in all on both sides (AdaKV: per-head counts differ, a layer's total "
        f"is 3 x N).",
        "",
        "| policy | kvpress press | N | agreement % (mean) | lowest head % | inside % (mean) | identical heads | "
        "equal layer totals | rule |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for case, got in rows:
        press, kwargs = case["press"]
        if "press" in kwargs:
            press = f"{press}({kwargs['press'][0]})"
        elif "presses" in kwargs:
            press = f"{press}([{', '.join(p for p, _ in kwargs['presses'])}])"
        lines.append(f"| `{case['id']}` | `{press}` | {case['n']} | {got['mean']:.2f} | {got['min']:.1f} | "
                     f"{got['inside']:.2f} | {got['identical']}/{got['heads']} | {got['totals']}/{got['layers']} | "
                     f"{case['rule']} |")
    lines += ["", f"Wall time: {time.perf_counter() - t0:.0f} s (venv {t_venv - t0:.0f} s incl. model load, kvpress "
                  f"side {t_kvpress - t_venv:.0f} s)."]
    table = "\n".join(lines)
    print(table)
    if not print_only:
        write_section(table, BEGIN, END, "kvpress parity (CPU)")


def write_section(table: str, begin: str, end: str, title: str) -> None:
    """Put ``table`` between the markers ``begin`` and ``end`` of bench/RESULTS.md, or at its end under a new
    ``## title`` when the markers are not there yet."""
    text = RESULTS.read_text()
    if begin in text and end in text:
        text = text[: text.index(begin)] + f"{begin}\n{table}\n{end}" + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n{begin}\n{table}\n{end}\n"
    RESULTS.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true", help="print the table, leave RESULTS.md alone")
    ap.add_argument("--kvpress-out", metavar="FILE", help="keep kvpress' kept sets in FILE; reuse them if it exists")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only the cases whose id starts with one of these "
                    "(implies --print)")
    ap.add_argument("--kvpress-side", nargs=3, metavar=("MODEL_DIR", "IDS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only:
        CASES[:] = [c for c in CASES if any(c["id"].startswith(prefix) for prefix in args.only)]
        if not CASES:
            raise SystemExit(f"--only: no case id starts with {' or '.join(args.only)}")
        args.print = True
    if args.kvpress_side:
        kvpress_side(*args.kvpress_side)
    else:
        run(args.print, args.kvpress_out)


if __name__ == "__main__":
    main()
