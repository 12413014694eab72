"""The per-sample result row (:class:`EvalRow`, the Parquet row schema) and how one is built and scored."""
from __future__ import annotations

import json
from typing import Any, Mapping, TypedDict

from kdeval.evals.tasks.base import Sample, Task
from kdeval.evals.tasks.prompting import BuiltPrompt
from kdeval.evals.tasks.scoring import score_row_fields
from kdeval.evals.tasks.thinking import scored_text


class EvalRow(TypedDict):
    """One scored sample of one run (the Parquet row schema).

    Metric sub-scores (e.g. ``rouge_l_recall``, ``has_boxed``) are added as extra float columns
    named after the sub-score; ``length`` and ``depth`` are copied out of ``meta`` when present. With
    ``thinking="strip"`` a string column ``answer`` holds the scored text (``prediction`` less its thinking block).
    """

    task: str                  # registry name, e.g. "ruler.niah_single_1"
    id: str                    # stable sample id (pairs runs item by item)
    prompt_hash: str           # sha256[:16] of the exact prompt token ids
    prompt_tokens: int         # prompt length fed to the model
    truncated: bool            # middle truncation happened
    removed_tokens: int        # tokens removed by the truncation
    chat_template: bool        # the chat template was applied
    context_shared: bool       # the context prefill was shared with other questions
    shared_prefill_s: float | None  # seconds of the shared context prefill (0.0 when not shared; None as ttft_s)
    execution: str             # "alone", or "shared": prompt steps recorded for or replayed from other cells
    replayed_steps: int        # prompt steps replayed from other cells' identical steps (kdeval/keydiff/step/shared.py)
    prediction: str            # decoded generation (special tokens skipped)
    generated_tokens: int      # number of generated tokens (eos excluded)
    max_new_tokens: int        # the sample's generation cap (the benchmark's, or generation.max_new_tokens)
    hit_max_new_tokens: bool   # the generation stopped at the cap, not at an eos token (a truncated trace)
    references: list[str]      # acceptable answers
    score: float               # the task's per-sample score in [0, 1]
    ttft_s: float | None       # time to first token of this generate call (None: computed with shared steps)
    extra_forward_tokens: int  # tokens of a policy's forwards besides the prompt's (KVzip's repeat pass; in ttft_s)
    timing_batch: int          # rows timed by one generate call share it (and ttft_s): one timing, not several
    decode_s: float            # decoding time
    peak_memory_bytes: int     # process (RSS) or GPU (max allocated) peak during the call, weights included
    memory_kind: str           # what peak_memory_bytes is: "process_rss" or "cuda_max_allocated"
    peak_kv_tokens: int        # most tokens held in the KV cache per layer
    peak_kv_bytes: int         # most K/V bytes the request held by its own tokens during the call, all layers
    kv_buffer_bytes: int       # most K/V buffer bytes allocated for the call's batch (padding, slots ahead): how it ran
    windowed_kv_bytes: int     # K/V bytes the windowed layers (sliding/chunked: not the policy's) keep at the end
    state_bytes: int           # recurrent layers' state bytes (not K/V, not the policy's; constant in length)
    layer_kinds: str           # the model's layers by kind ("18 layers: 3 full, 15 sliding 512"; "": all full)
    model_weight_bytes: int    # bytes of the model's parameters and buffers (the same in every row of a run)
    kept_tokens: int           # tokens in the cache at the end
    resolved_budget: int | None  # N this sample kept: the budget, or its share of this prompt (None: no budget)
    resolved_chunk: int        # B this sample was prefilled with (under chunk size "whole": the tokens compressed)
    compressed_tokens: int     # tokens of what is compressed: the prompt, its context (compress="context"),
                               # the generated tokens (compress="generated": the prompt is kept whole)
    length: int | None         # target length (synthetic tasks)
    depth: float | None        # needle depth in percent (needle, phonebook)
    meta_json: str             # the sample's remaining metadata as JSON (all_classes, ...)



def result_row(task: Task, sample: Sample, prompt: BuiltPrompt, text: str, n_gen: int, stats: Mapping[str, Any],
         shared: bool, shared_s: float, weight_bytes: int = 0, budget: int | None = None,
         chunk: int = 0, compress: str = "prompt", strip: tuple[str, str] | None = None,
         timing_batch: int = 0) -> dict[str, Any]:
    """The scored row of one sample: what was fed (``prompt``), what came out (``text``, ``n_gen`` tokens), the
    engine's ``stats``, and the settings it ran under (N = ``budget``, B = ``chunk``, the protocol's
    ``compress``; ``strip``: the thinking block's markers when ``thinking="strip"``)."""
    meta = dict(sample.meta)
    row: dict[str, Any] = {
        "task": task.name,
        "id": sample.id,
        "prompt_hash": prompt.hash,
        "prompt_tokens": prompt.n_tokens,
        "truncated": prompt.truncated,
        "removed_tokens": prompt.removed_tokens,
        "chat_template": prompt.used_chat_template,
        "context_shared": shared,
        "shared_prefill_s": float(shared_s),
        "execution": "alone",
        "replayed_steps": int(stats.get("replayed_steps", 0)),
        "prediction": text,
        "generated_tokens": int(n_gen),
        "max_new_tokens": sample.new_tokens(1),  # a conversation's turn: its own length
        "hit_max_new_tokens": int(n_gen) >= sample.new_tokens(1),
        "references": list(sample.references),
        "ttft_s": float(stats.get("ttft_s", 0.0)),
        "extra_forward_tokens": int(stats.get("extra_forward_tokens", 0)),
        "timing_batch": int(timing_batch),
        "decode_s": float(stats.get("decode_s", 0.0)),
        "peak_memory_bytes": int(stats.get("peak_memory_bytes", 0)),
        "memory_kind": str(stats.get("memory_kind", "")),
        "peak_kv_tokens": int(stats.get("peak_kv_tokens", 0)),
        "peak_kv_bytes": int(stats.get("peak_kv_bytes", 0)),
        "kv_buffer_bytes": int(stats.get("kv_buffer_bytes", 0)),
        "windowed_kv_bytes": int(stats.get("windowed_kv_bytes", 0)),
        "state_bytes": int(stats.get("state_bytes", 0)),
        "layer_kinds": str(stats.get("layer_kinds", "")),
        "model_weight_bytes": int(weight_bytes),
        "kept_tokens": int(stats.get("kept_tokens", 0)),
        "resolved_budget": budget,
        "resolved_chunk": int(chunk),
        "compressed_tokens": (len(prompt.prefix_ids) if compress == "context" else int(n_gen)
                              if compress == "generated" else prompt.n_tokens),
        "length": meta.pop("length", None),
        "depth": meta.pop("depth", None),
        "meta_json": json.dumps(meta, ensure_ascii=False, sort_keys=True),
    }
    answer = text
    if strip is not None:  # thinking="strip": score the text after the thinking block, keep the raw prediction
        answer = row["answer"] = scored_text(text, "strip", strip)
    row.update(score_row_fields(task, answer, sample.references, sample.meta))
    return row
