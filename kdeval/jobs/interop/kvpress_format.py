"""kvpress's evaluation layout, as its ``evaluation/evaluate.py`` writes it, and how kdeval names map onto it.

A kvpress result is one directory ``<dataset>__<data_dir>__<model>__<press>__<ratio>[__query_aware]`` (empty
parts left out, the model's ``/`` as ``--``, the ratio with two decimals) holding ``predictions.csv`` (the
dataset's columns but ``context``, plus ``predicted_answer`` and ``compression_ratio``), ``metrics.json`` (its
benchmark's scorer; RULER: ``{task: {"string_match": points}}``) and ``config.yaml`` (its EvaluationConfig).
``query_aware`` is kvpress's name for compressing the question with the context: kdeval's ``compress: prompt``.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

#: kdeval policy -> kvpress press name (PRESS_REGISTRY of kvpress's evaluation), where kvpress has that press.
PRESS_NAMES = {"full": "no_press", "keydiff": "keydiff", "snapkv": "snapkv", "tova": "tova", "knorm": "knorm",
               "random": "random", "pyramidkv": "pyramidkv", "lagkv": "lagkv", "chunkkv": "chunkkv",
               "sink": "streaming_llm", "ada-snapkv": "adakv_snapkv"}
#: kvpress press name -> kdeval policy (importing a kvpress run).
POLICIES = {press: policy for policy, press in PRESS_NAMES.items()}

#: The files of one kvpress result directory.
FILES = ("predictions.csv", "metrics.json", "config.yaml")

_CONTROL = re.compile(r"[\x00-\x1f]")


def dataset_of(task: str, length: int | None) -> tuple[str, str, str]:
    """(kvpress dataset, data_dir, its ``task`` column) of a kdeval task: ``ruler.vt`` at 4096 -> ("ruler",
    "4096", "vt"); ``longbench.qasper`` -> ("longbench", "qasper", "qasper"); ``needle`` ->
    ("needle_in_haystack", "", "needle"); another task keeps its own name."""
    if task.startswith("ruler."):
        return "ruler", "" if length is None else str(length), task.removeprefix("ruler.")
    if task.startswith("longbench."):
        name = task.removeprefix("longbench.")
        return "longbench", name, name
    if task == "needle":
        return "needle_in_haystack", "", "needle"
    return task, "", task


def task_of(dataset: str, task_column: str) -> str:
    """The kdeval task of a kvpress dataset and its ``task`` column (:func:`dataset_of` reversed)."""
    if dataset == "ruler":
        return f"ruler.{task_column}"
    if dataset.startswith("longbench"):
        return f"longbench.{task_column}"
    return "needle" if dataset == "needle_in_haystack" else task_column


def results_dir_name(dataset: str, data_dir: str, model: str, press: str, ratio: float, query_aware: bool,
                     extra: Iterable[str] = ()) -> str:
    """kvpress's directory name for these settings (``extra``: further ``__`` parts, appended last)."""
    parts = [dataset, data_dir, model.replace("/", "--"), press, f"{ratio:.2f}"]
    parts += (["query_aware"] if query_aware else []) + list(extra)
    return "__".join(p for p in parts if p)


def clean_prediction(text: str) -> str:
    """A prediction as kvpress's RULER scorer reads it: stripped, control characters removed."""
    return _CONTROL.sub("", text.strip()).strip()


def string_match(task_column: str, predictions: list[str], answers: list[list[str]]) -> float:
    """kvpress's RULER score in points, rounded to 2 decimals: for ``qa`` tasks the share of samples where some
    answer occurs in the prediction (case-insensitive), for the others the mean share of answers that occur."""
    preds = [clean_prediction(p).lower() for p in predictions]
    if task_column.split("_")[0] == "qa":
        hits = [max(1.0 if a.lower() in p else 0.0 for a in ans) for p, ans in zip(preds, answers)]
    else:
        hits = [sum(1.0 if a.lower() in p else 0.0 for a in ans) / len(ans) for p, ans in zip(preds, answers)]
    return round(sum(hits) / len(hits) * 100, 2)


def evaluation_config(dataset: str, data_dir: str, model: str, press: str, ratio: float, query_aware: bool,
                      max_new_tokens: int | None, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The ``config.yaml`` mapping: kvpress's EvaluationConfig fields in its order, then ``kdeval`` (what kdeval
    ran: run, cell, budget, chunk size, protocol, version)."""
    return {"dataset": dataset, "data_dir": data_dir or None, "model": model, "device": None, "press_name": press,
            "compression_ratio": ratio, "key_channel_compression_ratio": None, "threshold": None, "fraction": 1.0,
            "max_new_tokens": max_new_tokens, "max_context_length": None, "query_aware": query_aware,
            "needle_depth": None, "compression_interval": None, "target_size": None,
            "hidden_states_buffer_size": None, "output_dir": ".", "log_level": "INFO", "model_kwargs": None,
            "press_init_command": None, "seed": seed, "fp8": False, "kdeval": extra}
