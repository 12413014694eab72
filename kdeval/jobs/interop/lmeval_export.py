"""``kdeval export RUN --format lm-eval --out DIR`` (:mod:`kdeval.jobs.interop.export_dir`): a run's done cells as
lm-evaluation-harness output.

lm-evaluation-harness writes, per evaluated model, ``<out>/<model_name_sanitized>/results_<date>.json`` (its
``EvalResults``: ``results`` per task with ``<metric>,<filter>`` and ``<metric>_stderr,<filter>`` keys,
``configs``, ``versions``, ``n-shot``, ``higher_is_better``, ``n-samples`` with ``original`` / ``effective``,
``config``, then the tracker's fields) and ``samples_<task>_<date>.jsonl`` (one ``SampleResult`` per line). A
kdeval configuration (model × policy × budget × chunk size × protocol) is one such "model": its name is the model
id with the configuration appended, ``smollm2-135m,kv=keydiff,N=25%,B=128,query-aware``, sanitized as
lm-eval does. Each task instance (task, and length when it has one; seeds pooled) is one lm-eval task whose
metric is kdeval's per-sample ``score`` (in [0, 1]; stderr = sample std / √n). kdeval keeps prompt hashes, not
prompt texts: a sample's ``arguments`` hold the generation settings and an empty prompt.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.grid.schema import COMPRESS_NAMES

METRIC = "score"
FILTER = "none"


def sanitize_model_name(name: str) -> str:
    """lm-eval's directory name for a model name (the characters it replaces, as ``__``)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_name(spec: dict[str, Any]) -> str:
    """The "model" name of a kdeval configuration (see the module docstring)."""
    if spec["policy"] == "full":
        return f"{spec['model']['id']},kv=full,B={chunk_text(spec['chunk_size'])}"
    protocol = spec.get("protocol") or {}
    name = (f"{spec['model']['id']},kv={spec['policy']},N={spec['budget']},B={chunk_text(spec['chunk_size'])},"
            f"{COMPRESS_NAMES[protocol.get('compress', 'prompt')]}")
    params = spec.get("policy_params") or {}
    name += "".join(f",{k}={params[k]}" for k in sorted(params))
    return name + (",decode=keep" if protocol.get("decode") == "keep" else "")


def task_name(spec: dict[str, Any]) -> str:
    """The lm-eval task name of a cell's task instance: ``needle_1024``, ``ruler.vt_4096``, ``math500``."""
    t = spec["task"]
    return t["name"] if t.get("length") is None else f"{t['name']}_{t['length']}"


def _sample(doc_id: int, row: dict[str, Any], max_new: int | None) -> dict[str, Any]:
    doc = {"id": row["id"], "references": list(row.get("references") or []), "meta": json.loads(row.get("meta_json") or "{}")}
    if row.get("turn") is not None:  # a turn of a conversation: which one, its question and the answer fed back
        doc.update(turn=int(row["turn"]), question=row.get("question"), answer_fed=row.get("answer_fed"))
    target = str(doc["references"])
    return {"doc_id": doc_id, "doc": doc, "target": target,
            "arguments": {"gen_args_0": {"arg_0": "", "arg_1": {"until": [], "do_sample": False,
                                                                  "max_gen_toks": max_new}}},
            "resps": [[row.get("prediction") or ""]], "filtered_resps": [row.get("prediction") or ""],
            "filter": FILTER, "metrics": [METRIC],
            "doc_hash": _sha(json.dumps(doc, sort_keys=True, ensure_ascii=False)),
            "prompt_hash": str(row.get("prompt_hash") or ""), "target_hash": _sha(target),
            METRIC: float(row["score"])}


def _stderr(scores: list[float]) -> float:
    n = len(scores)
    if n < 2:
        return float("nan")
    mean = sum(scores) / n
    return math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1) / n)


def lmeval_files(run_id: str, cells: list[tuple[Any, list[dict[str, Any]]]], date: datetime | None = None
                 ) -> dict[str, str]:
    """Relative path -> text of every file of the export of run ``run_id``'s done ``cells`` (view, rows), dated
    ``date`` (default: now)."""
    date = date or datetime.now(timezone.utc)
    date_id = date.replace(tzinfo=None).isoformat().replace(":", "-")
    by_config: dict[str, dict[str, list[tuple[Any, list[dict[str, Any]]]]]] = defaultdict(lambda: defaultdict(list))
    for view, rows in cells:
        by_config[config_name(view.spec)][task_name(view.spec)].append((view, rows))
    files: dict[str, str] = {}
    for name, tasks in by_config.items():
        folder = sanitize_model_name(name)
        results, configs, versions, n_samples = {}, {}, {}, {}
        first_spec = next(iter(tasks.values()))[0][0].spec
        for task, members in sorted(tasks.items()):
            rows = [r for _, rs in members for r in rs]
            scores = [float(r["score"]) for r in rows]
            stderr = _stderr(scores)
            results[task] = {"name": task, "alias": task, "sample_len": len(rows),
                             f"{METRIC},{FILTER}": sum(scores) / len(scores),
                             f"{METRIC}_stderr,{FILTER}": None if math.isnan(stderr) else stderr}
            spec = members[0][0].spec
            configs[task] = {"task": task, "dataset_path": spec["task"].get("data_source") or spec["task"]["name"],
                             "output_type": "generate_until", "num_fewshot": 0,
                             "generation_kwargs": {"until": [], "do_sample": False,
                                                   "max_gen_toks": spec["task"].get("max_new_tokens")},
                             "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True}],
                             "metadata": {"kdeval_cells": [v.id for v, _ in members], "run_id": run_id,
                                          "task_params": spec["task"].get("params") or {}}}
            versions[task] = spec.get("kdeval_version")
            n_samples[task] = {"original": len(rows), "effective": len(rows)}
            lines = [json.dumps(_sample(i, r, spec["task"].get("max_new_tokens")), ensure_ascii=False)
                     for i, r in enumerate(rows)]
            files[f"{folder}/samples_{task}_{date_id}.jsonl"] = "\n".join(lines) + "\n"
        model = first_spec["model"]
        body = {"results": results, "group_subtasks": {}, "configs": configs, "versions": versions,
                "n-shot": {t: 0 for t in results}, "higher_is_better": {t: {METRIC: True} for t in results},
                "n-samples": n_samples,
                "config": {"model": "kdeval", "model_args": {
                    "pretrained": model["id"], "dtype": model.get("dtype"), "revision": model.get("revision"),
                    "attn_implementation": model.get("attn_implementation"), "kv_policy": first_spec["policy"],
                    "kv_policy_params": first_spec.get("policy_params") or {}, "budget": first_spec.get("budget"),
                    "chunk_size": first_spec["chunk_size"], "protocol": first_spec.get("protocol")},
                    "batch_size": None, "batch_sizes": [], "device": None, "use_cache": None, "limit": None,
                    "bootstrap_iters": 0, "gen_kwargs": {"do_sample": False}, "random_seed": None,
                    "numpy_seed": None, "torch_seed": None, "fewshot_seed": None},
                "date": date.timestamp(), "model_source": "kdeval", "model_name": name,
                "model_name_sanitized": folder, "task_hashes": {}, "kdeval_run_id": run_id}
        files[f"{folder}/results_{date_id}.json"] = json.dumps(body, indent=2, ensure_ascii=False)
    return files
