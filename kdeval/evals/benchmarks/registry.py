"""The flat registry of tasks: name -> TaskSpec (benchmark, metric, data source, factory).

Names: ``needle``, ``phonebook``, ``math500``, ``aime2025``, ``instructions.<position>`` (3), ``ifeval``, ``ruler.<task>``
(13), ``longbench.<task>`` (21), ``longbench2``, ``infinitebench.<task>`` (5), ``loogle.<task>`` (2), and with
several questions per context
``turns.<task>`` (4) and ``scbench.<task>`` (13).
Suites ``ruler``, ``longbench``, ``infinitebench``, ``loogle``, ``turns``, ``scbench`` and ``instructions`` expand to their tasks (:func:`expand`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kdeval.evals.benchmarks.aime2025 import Aime2025Task
from kdeval.evals.benchmarks.file_task import FileTask
from kdeval.evals.benchmarks.instructions import POSITIONS, IFEvalTask, InstructionsTask
from kdeval.evals.benchmarks.infinitebench.generated import InfiniteBenchSyntheticTask
from kdeval.evals.benchmarks.infinitebench.task import InfiniteBenchTask
from kdeval.evals.benchmarks.longbench import LONGBENCH_TASKS, LongBenchTask
from kdeval.evals.benchmarks.longbench2 import LongBench2Task
from kdeval.evals.benchmarks.loogle.task import LooGLETask
from kdeval.evals.benchmarks.loogle.turns import LooGLETurnsTask
from kdeval.evals.benchmarks.math500 import Math500Task
from kdeval.evals.benchmarks.needle import NeedleTask
from kdeval.evals.benchmarks.phonebook import PhonebookTask
from kdeval.evals.benchmarks.ruler import CONFIGS as RULER_CONFIGS
from kdeval.evals.benchmarks.ruler import RulerTask
from kdeval.evals.benchmarks.scbench.task import TASKS as SCBENCH_TASKS
from kdeval.evals.benchmarks.scbench.task import SCBenchTask
from kdeval.evals.benchmarks.turns import KVTurnsTask, NeedlesTurnsTask
from kdeval.evals.metrics.longbench import DATASET2METRIC
from kdeval.evals.metrics.loogle import NOT_COMPUTED
from kdeval.evals.tasks.base import EvalError, Task, UnknownTaskError
from kdeval.names import suggest


@dataclass(frozen=True)
class TaskSpec:
    """What ``kdeval tasks`` shows about a task, and how to build it."""

    name: str
    benchmark: str
    metric: str
    source: str
    cls: type[Task]
    fixed: tuple[tuple[str, Any], ...] = ()  # constructor arguments the name implies (e.g. subset)

    def params(self) -> dict[str, Any]:
        """The parameters a user may set, with their defaults."""
        fixed = dict(self.fixed)
        out = {}
        for f in dataclasses.fields(self.cls):
            if f.init and f.name not in fixed and not f.name.startswith("_"):
                default = f.default if f.default is not dataclasses.MISSING else None
                out[f.name] = list(default) if isinstance(default, tuple) else default
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description."""
        return {"name": self.name, "benchmark": self.benchmark, "metric": self.metric, "source": self.source,
                "params": self.params()}

    def build(self, **params: Any) -> Task:
        """The task with ``params`` (unknown parameter names are an error naming the allowed ones)."""
        allowed = self.params()
        for key in params:
            if key not in allowed:
                did = suggest(key, allowed)
                raise EvalError(f"{key}: unknown parameter for task {self.name!r}{did} (parameters: {', '.join(allowed)})")
        try:
            return self.cls(**dict(self.fixed), **params)
        except TypeError as e:  # wrong types that dataclass validation did not catch
            raise EvalError(f"task {self.name!r}: bad parameters {params}: {e}") from None


def _specs() -> dict[str, TaskSpec]:
    specs = [
        TaskSpec("needle", "needle", "contains (headline) + rouge_l_recall", "<data dir>/haystack/PaulGrahamEssays.json (noise haystack if absent)", NeedleTask),
        TaskSpec("phonebook", "phonebook", "exact_match", "synthetic", PhonebookTask),
        TaskSpec("math500", "math500", "math_equivalence (last \\boxed{})", "<data dir>/math500/test.jsonl or hub HuggingFaceH4/MATH-500", Math500Task),
    ]
    for pos in POSITIONS:
        specs.append(TaskSpec(f"instructions.{pos}", "ifeval", f"IFEval's checks, instructions {POSITIONS[pos]}: "
                              "instruction-level strict (headline), prompt-level strict and loose, per instruction",
                              "synthetic instructions + <data dir>/haystack/PaulGrahamEssays.json (noise haystack "
                              "if absent)", InstructionsTask, (("position", pos),)))
    specs += [
        TaskSpec("ifeval", "ifeval", "IFEval's checks: prompt-level strict (headline), loose, "
                 "instruction-level", "<data dir>/ifeval/input_data.jsonl (IFEval's released prompts; those "
                 "whose instructions are ported)", IFEvalTask),
    ]
    for t, cfg in RULER_CONFIGS.items():
        if cfg["task"] == "qa":
            src = f"<data dir>/ruler/{cfg['dataset']}.json or hub ({'rajpurkar/squad_v2' if cfg['dataset'] == 'squad' else 'hotpotqa/hotpot_qa'})"
            metric = "string_match_part"
        else:
            src = "synthetic" + (" + <data dir>/haystack/PaulGrahamEssays.json" if cfg.get("type_haystack") == "essay" else "")
            metric = "string_match_all"
        specs.append(TaskSpec(f"ruler.{t}", "ruler", metric, src, RulerTask, (("task", t),)))
    for t in LONGBENCH_TASKS:
        specs.append(TaskSpec(f"longbench.{t}", "longbench", DATASET2METRIC[t].__name__,
                              f"<data dir>/longbench/{t}.jsonl or hub THUDM/LongBench", LongBenchTask, (("subset", t),)))
    specs += [
        TaskSpec("longbench2", "longbench2", "accuracy (\"The correct answer is (X)\"; by difficulty and length)",
                 "<data dir>/longbench2/data.json or hub THUDM/LongBench-v2", LongBench2Task),
        TaskSpec("aime2025", "aime2025", "math_equivalence (last \\boxed{})",
                 "<data dir>/aime2025/aime2025-{I,II}.jsonl or hub opencompass/AIME2025", Aime2025Task),
    ]
    for t, metric in (("en_qa", "qa_f1 (max over answers)"), ("en_mc", "choice_match (letter or option text)")):
        file = "longbook_qa_eng" if t == "en_qa" else "longbook_choice_eng"
        specs.append(TaskSpec(f"infinitebench.{t}", "infinitebench", metric,
                              f"<data dir>/infinitebench/{file}.jsonl or hub xinrongzhang2022/InfiniteBench",
                              InfiniteBenchTask, (("subset", t),)))
    for t, metric in (("passkey", "first_int_match"), ("number_string", "first_int_match"),
                      ("kv_retrieval", "word_match")):
        specs.append(TaskSpec(f"infinitebench.{t}", "infinitebench", metric, "synthetic (InfiniteBench's recipe)",
                              InfiniteBenchSyntheticTask, (("subset", t),)))
    missing = "; ".join(f"{k} not computed: {v}" for k, v in NOT_COMPUTED.items())
    for t in ("shortdep_qa", "longdep_qa"):
        specs.append(TaskSpec(f"loogle.{t}", "loogle",
                              f"rouge_l_recall (headline) + bleu1/bleu4/rouge1/rouge2, meteor with WordNet data; {missing}",
                              f"<data dir>/loogle/{t}.jsonl or hub bigainlco/LooGLE", LooGLETask, (("subset", t),)))
    specs += [
        TaskSpec("turns.kv", "turns", "word_match (InfiniteBench kv_retrieval), one key per turn",
                 "synthetic (SCBench's Retr.KV, InfiniteBench's recipe)", KVTurnsTask),
        TaskSpec("turns.needles", "turns", "string_match_all (RULER), one needle per turn",
                 "synthetic (RULER's needles) + <data dir>/haystack/PaulGrahamEssays.json with haystack: essay",
                 NeedlesTurnsTask),
    ]
    for t in ("shortdep_qa", "longdep_qa"):
        specs.append(TaskSpec(f"turns.loogle.{t}", "turns", "rouge_l_recall (LooGLE's), a document's questions as turns",
                              f"<data dir>/loogle/{t}.jsonl or hub bigainlco/LooGLE", LooGLETurnsTask,
                              (("subset", t),)))
    specs.append(TaskSpec("file", "file", "params.metric (string_match_part by default; kdeval.evals.metrics.registry)",
                          "a local .jsonl, .parquet or .csv file (params.path; kvpress's dataset columns by default)",
                          FileTask))
    for t, scb in SCBENCH_TASKS.items():
        specs.append(TaskSpec(f"scbench.{t}", "scbench", f"{scb.metric} (SCBench's), per turn",
                              f"<data dir>/scbench/scbench_{t}.jsonl (SCBench's released file)", SCBenchTask,
                              (("subset", t),)))
    return {s.name: s for s in specs}


REGISTRY: dict[str, TaskSpec] = _specs()
SUITES: dict[str, tuple[str, ...]] = {
    "ruler": tuple(n for n in REGISTRY if n.startswith("ruler.")),
    "longbench": tuple(n for n in REGISTRY if n.startswith("longbench.")),
    "infinitebench": tuple(n for n in REGISTRY if n.startswith("infinitebench.")),
    "loogle": tuple(n for n in REGISTRY if n.startswith("loogle.")),
    "turns": tuple(n for n in REGISTRY if n.startswith("turns.")),
    "scbench": tuple(n for n in REGISTRY if n.startswith("scbench.")),
    "instructions": tuple(n for n in REGISTRY if n.startswith("instructions.")),
}


def task_names() -> list[str]:
    """Every registered task name."""
    return list(REGISTRY)


def _unknown(name: str) -> UnknownTaskError:
    candidates = list(REGISTRY) + list(SUITES)
    return UnknownTaskError(f"unknown task {name!r}{suggest(name, candidates)} (run `kdeval tasks` for the list)")


def get_spec(name: str) -> TaskSpec:
    """The spec of task ``name`` (UnknownTaskError with suggestions otherwise)."""
    if name not in REGISTRY:
        raise _unknown(name)
    return REGISTRY[name]


def get_task(name: str, **params: Any) -> Task:
    """Build task ``name`` with ``params`` (validated; data presence is checked here)."""
    return get_spec(name).build(**params)


def get_scorer(name: str) -> Task:
    """Task ``name`` built for scoring only: no data files are read or checked."""
    spec = get_spec(name)
    if spec.cls is RulerTask:
        return spec.build(verify_data=False)
    if spec.cls is NeedleTask:
        return spec.build(haystack="noise")
    if spec.cls in (LongBenchTask, Math500Task, LongBench2Task, InfiniteBenchTask, LooGLETask, Aime2025Task):
        return spec.build(source="hub")  # the hub is only contacted by samples()
    return spec.build()


def expand(names: list[str] | tuple[str, ...] | str) -> list[str]:
    """Task names with suites (``ruler``, ``longbench``, ``infinitebench``, ``loogle``) expanded; unknown names raise."""
    out: list[str] = []
    for n in [names] if isinstance(names, str) else names:
        if n in SUITES:
            out.extend(SUITES[n])
        elif n in REGISTRY:
            out.append(n)
        else:
            raise _unknown(n)
    return out

