"""``kdeval export RUN --format kvpress --out DIR`` (:mod:`kdeval.jobs.interop.export_dir`): a run's done cells as kvpress
evaluation results.

One kvpress directory per task × model × policy × budget (and protocol, and chunk size: see below), named and
filled as kvpress's ``evaluation/evaluate.py`` does (:mod:`kdeval.jobs.interop.kvpress_format`): RULER cells of one
length share the ``ruler`` directory of that length, one ``task`` value each, as in kvpress.

* press: the policy's kvpress name where kvpress has the press (``full`` -> ``no_press``), else kdeval's name;
* ratio: a share budget's kvpress ratio ``1 − share``; a token budget N has none, so each row gets its own
  ``1 − min(N, L) / L`` (L: the tokens compressed) and the directory the mean of those;
* ``query_aware`` when the question was compressed with the context (``compress: prompt``);
* a chunked cell's directory ends in ``__kdeval_chunk<B>`` (kvpress always compresses once: one-shot,
  kdeval's chunk size ``whole``, has no such part), decode without eviction in ``__kdeval_decode_keep``.

``predictions.csv``: ``id`` (kdeval's sample id), ``task``, ``answer`` (the references, a Python list's text as
pandas writes a list column), ``predicted_answer``, ``compression_ratio``, then kdeval's ``score``,
``prompt_tokens`` and ``resolved_budget``. kdeval stores prompt hashes, not the context or question texts, so
those columns are absent. ``metrics.json``: RULER's string match computed as kvpress computes it; for other
datasets kdeval's own per-task metric (``{"kdeval_score": points}``), since kvpress's scorer for them differs.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pandas as pd
import yaml

from kdeval.evals.task_run.budget import is_share, kvpress_ratio
from kdeval.evals.task_run.chunking import is_whole
from kdeval.jobs.interop import kvpress_format as kv


def _row_ratio(row: dict[str, Any], budget: Any) -> float:
    if budget is None:
        return 0.0
    if is_share(budget):
        return kvpress_ratio(budget)
    tokens = row.get("compressed_tokens") or row.get("prompt_tokens") or 0
    return 1.0 - min(int(budget), tokens) / tokens if tokens else 0.0


def _dir_of(spec: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A cell's kvpress directory name and the settings its config.yaml records."""
    task = spec["task"]
    dataset, data_dir, _ = kv.dataset_of(task["name"], task.get("length"))
    budget = spec.get("budget")
    ratios = [_row_ratio(r, budget) for r in rows]
    ratio = kvpress_ratio(budget) if is_share(budget) else (sum(ratios) / len(ratios) if ratios else 0.0)
    protocol = spec.get("protocol") or {}
    free = spec["policy"] == "full"
    query_aware = not free and protocol.get("compress", "prompt") == "prompt"
    extra = [] if is_whole(spec["chunk_size"]) else [f"kdeval_chunk{spec['chunk_size']}"]  # full too: B differs
    extra += ["kdeval_decode_keep"] if protocol.get("decode") == "keep" else []
    conversation = spec.get("conversation") or {}
    if conversation:  # a conversation's turns are rows of one file; its mode names the directory
        extra.append("kdeval_" + conversation.get("mode", "multi-turn").replace("-", "_")
                     + ("_own" if conversation.get("answers") == "own" else ""))
    if spec.get("policy_params"):
        extra.append("kdeval_params" + "_".join(f"{k}-{v}" for k, v in sorted(spec["policy_params"].items())))
    press = kv.PRESS_NAMES.get(spec["policy"], spec["policy"])
    name = kv.results_dir_name(dataset, data_dir, spec["model"]["id"], press, ratio, query_aware, extra)
    return name, dict(dataset=dataset, data_dir=data_dir, model=spec["model"]["id"], press=press, ratio=ratio,
                      query_aware=query_aware)


def kvpress_files(run_id: str, cells: list[tuple[Any, list[dict[str, Any]]]]) -> dict[str, str]:
    """Relative path -> text of every file of the export of run ``run_id``'s done ``cells`` (view, rows)."""
    groups: dict[str, list[tuple[Any, list[dict[str, Any]]]]] = defaultdict(list)
    settings: dict[str, dict[str, Any]] = {}
    for view, rows in cells:
        name, setting = _dir_of(view.spec, rows)
        groups[name].append((view, rows))
        settings[name] = setting
    files: dict[str, str] = {}
    for name, members in groups.items():
        s = settings[name]
        table, metrics, cells = [], {}, []
        for view, rows in members:
            spec = view.spec
            _, _, task_col = kv.dataset_of(spec["task"]["name"], spec["task"].get("length"))
            cells.append({"cell_id": view.id, "task": spec["task"]["name"], "length": spec["task"].get("length"),
                          "seed": spec["task"].get("seed"), "budget": spec.get("budget"),
                          "chunk_size": spec["chunk_size"], "protocol": spec.get("protocol"),
                          **({"conversation": spec["conversation"]} if spec.get("conversation") else {}),
                          "policy": spec["policy"], "policy_params": spec.get("policy_params") or {},
                          "kdeval_version": spec.get("kdeval_version")})
            for r in rows:
                table.append({"id": r["id"], "task": task_col, "answer": str(list(r.get("references") or [])),
                              "predicted_answer": r.get("prediction") or "",
                              "compression_ratio": _row_ratio(r, spec.get("budget")), "score": r.get("score"),
                              "prompt_tokens": r.get("prompt_tokens"), "resolved_budget": r.get("resolved_budget"),
                              **({"turn": r["turn"]} if r.get("turn") is not None else {})})
            if s["dataset"] == "ruler":
                metrics[task_col] = {"string_match": kv.string_match(
                    task_col, [r.get("prediction") or "" for r in rows], [list(r["references"]) for r in rows])}
            else:
                metrics[task_col] = {"kdeval_score": round(100 * sum(r["score"] for r in rows) / len(rows), 2)}
        files[f"{name}/predictions.csv"] = pd.DataFrame(table).to_csv(index=False)
        files[f"{name}/metrics.json"] = json.dumps(metrics, indent=4)
        config = kv.evaluation_config(s["dataset"], s["data_dir"], s["model"], s["press"], round(s["ratio"], 6),
                                      s["query_aware"], None, 42,
                                      {"run_id": run_id, "computed_by": "kdeval", "cells": cells})
        files[f"{name}/config.yaml"] = yaml.safe_dump(config, sort_keys=False)
    return files
