"""SCBench (microsoft/MInference ``scbench/``, arXiv 2412.10319): several questions on one shared context, from
its released files.

Data: ``<data dir>/scbench/scbench_<task>.jsonl``, SCBench's format: one JSON object per line with ``context``
(the shared context) and ``multi_turns``, a list of ``{input, answer}``, plus each task's own fields:

- ``scbench_choice_eng``: each turn's ``options`` (four strings);
- ``scbench_mf`` (math find): each ``input`` names its target as ``The ... is`` (SCBench builds the question
  ``What is ...?`` from it), each ``answer`` is a number;
- ``scbench_repoqa``: the line's ``repo`` and ``lang`` (one of :data:`~kdeval.evals.benchmarks.scbench.specs.LANGUAGES`),
  each turn's ``name`` (the function asked for; ``answer`` is its code);
- ``scbench_summary_with_needles``, ``scbench_repoqa_and_kv`` (mixed tasks): each turn's ``task``, its sub-task
  (``scbench_summary`` / ``scbench_passkey``; ``scbench_repoqa`` / ``scbench_kv``), which sets its score and
  generation length; ``repoqa_and_kv`` also has ``repo`` and ``lang``, and a ``name`` on its repoqa turns.

An ``id`` when present names the sample. Each line is a sample whose turns are its questions
(``Task.multi_question``): they run as conversations (multi-turn or multi-request,
:mod:`kdeval.evals.task_run.conversation`).

Offline: SCBench publishes the files as the hub dataset ``microsoft/SCBench``, folder ``data/``, one file per
task: ``scbench_kv.jsonl``, ``scbench_prefix_suffix.jsonl``, ``scbench_vt.jsonl``, ``scbench_passkey.jsonl``,
``scbench_qa_eng.jsonl``, ``scbench_qa_chn.jsonl``, ``scbench_choice_eng.jsonl``, ``scbench_many_shot.jsonl``,
``scbench_mf.jsonl``, ``scbench_summary.jsonl``, ``scbench_repoqa.jsonl``, ``scbench_summary_with_needles.jsonl``,
``scbench_repoqa_and_kv.jsonl`` (its own ``eval_utils.py`` downloads them from
``huggingface.co/datasets/microsoft/SCBench/resolve/main/data/<file>``). kdeval reads local files only: on a
machine with internet access download them once (e.g. ``huggingface-cli download microsoft/SCBench --repo-type
dataset --include 'data/*'``), copy them to ``<data dir>/scbench/`` and point the data directory at them.

Prompts, lengths and scores: :mod:`kdeval.evals.benchmarks.scbench.specs`. Where kdeval differs from SCBench's chat path:
a later math-find turn asks ``What is ...?`` of its own question (SCBench's chat path reuses the last turn's), and
a later summary turn's answer does not start with SCBench's ``This paper`` (kdeval has one answer prefix per
sample).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.benchmarks.scbench.specs import LANGUAGES, TASKS, Spec, mf_prefix
from kdeval.evals.tasks.base import DataNotFoundError, EvalError, Followup, Sample, ScoreResult, Task, check_choice
from kdeval.evals.tasks.base import check_positive, group_percent, percent
from kdeval.evals.tasks.data import jsonl_objects

#: the sub-task of the repoqa turns (their ``name`` is the asked function)
REPOQA = "scbench_repoqa"


@dataclass
class SCBenchTask(Task):
    """One SCBench task from its released file; ``subset``: one of :data:`TASKS`.

    Args:
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        limit: keep only the first ``limit`` samples (contexts).
        max_turns: ask only each context's first ``max_turns`` questions.
    """

    subset: str
    data_dir: str | None = None
    limit: int | None = None
    max_turns: int | None = None

    benchmark: ClassVar[str] = "scbench"
    multi_question = True

    def __post_init__(self) -> None:
        check_choice("subset", self.subset, tuple(TASKS))
        check_positive("limit", self.limit, allow_none=True)
        check_positive("max_turns", self.max_turns, allow_none=True)
        self.name = f"scbench.{self.subset}"
        if self.spec.code and importlib.util.find_spec("tree_sitter_languages") is None:
            raise EvalError(f"{self.name}: its score finds function definitions with tree-sitter; install "
                            f"tree-sitter-languages (pip install 'kdeval[repoqa]')")
        self.data_files()

    @property
    def file(self) -> str:
        return f"scbench/scbench_{self.subset}.jsonl"

    def data_files(self) -> list[tuple[str, Any]]:
        from kdeval.evals.tasks.data import require_data_file

        how = (f"It is SCBench's scbench_{self.subset}.jsonl (hub dataset microsoft/SCBench, folder data/); put it at "
               f"<data dir>/{self.file}")
        return [(self.file, require_data_file(self.data_dir, self.file, how))]

    def data_source(self) -> str:
        return self.file

    @property
    def spec(self) -> Spec:
        return TASKS[self.subset]

    def generation_length(self) -> int:
        """SCBench's length; a mixed task's longest (each turn generates its own sub-task's)."""
        spec = self.spec
        return spec.max_new if isinstance(spec.max_new, int) else max(spec.max_new.values())

    def _check(self, where: str, row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The line's turns, after checking the fields the task needs (one line naming the first problem)."""
        spec = self.spec
        if not isinstance(row.get("context"), str):
            raise DataNotFoundError(f"{where}: field 'context' is missing or not text (expected SCBench rows "
                                    f"{{context, multi_turns: [{{input, answer}}]}})")
        for f in spec.sample_fields:
            if not isinstance(row.get(f), str) or not row[f]:
                raise DataNotFoundError(f"{where}: field '{f}' is missing or not text (expected SCBench's "
                                        f"scbench_{self.subset} rows {{{', '.join(spec.sample_fields)}, context, "
                                        f"multi_turns}})")
        if spec.code and row["lang"] not in LANGUAGES:
            raise DataNotFoundError(f"{where}: field 'lang': expected one of {', '.join(LANGUAGES)}, got "
                                    f"{row['lang']!r}")
        turns = row.get("multi_turns")
        if not isinstance(turns, list) or not turns:
            raise DataNotFoundError(f"{where}: field 'multi_turns' is missing or empty (expected a list of "
                                    f"{{{', '.join(spec.fields)}}})")
        for k, turn in enumerate(turns):
            missing = [f for f in spec.fields if not isinstance(turn, dict) or turn.get(f) in (None, "", [])]
            if missing:
                raise DataNotFoundError(f"{where}: multi_turns[{k}] has no field '{missing[0]}' (expected "
                                        f"{{{', '.join(spec.fields)}}})")
            problem = spec.problem(turn)
            if spec.mixed and turn["task"] not in spec.max_new:
                problem = f"task: expected one of {', '.join(spec.max_new)}, got {turn['task']!r}"
            elif self._asks_function(turn) and not turn.get("name"):
                problem = f"name: a {REPOQA} turn names the function it asks for"
            if problem:
                raise DataNotFoundError(f"{where}: multi_turns[{k}].{problem}")
        return turns

    def _asks_function(self, turn: Mapping[str, Any]) -> bool:
        return self.subset == "repoqa" or (self.spec.mixed and turn.get("task") == REPOQA)

    def _turn_meta(self, turn: Mapping[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"subtask": turn["task"]} if self.spec.mixed else {}
        if self.spec.code:
            meta["func_name"] = turn["name"] if self._asks_function(turn) else None
        return meta

    def _row(self, line: int, row: Mapping[str, Any], turns: list[Mapping[str, Any]],
             needles: Mapping[str, list[list[str]]]) -> Sample:
        spec = self.spec
        turns = turns[: self.max_turns]
        head = {"context": row["context"]}
        if "{prefix}" in spec.head:
            head["prefix"] = mf_prefix(turns[0])
        meta: dict[str, Any] = {}
        if spec.code:
            meta = {"repo": row["repo"], "lang": row["lang"], "needles": needles[row["repo"]]}
        follow = tuple(Followup("\n\n" + spec.turn_question(t, False), tuple(spec.references(t)), self._turn_meta(t))
                       for t in turns[1:])
        lengths = tuple(spec.max_new[t["task"]] for t in turns) if spec.mixed else ()
        return Sample(id=f"{self.name}/{row.get('id', line - 1)}", prefix=spec.head.format(**head),
                      suffix="\n\n" + spec.turn_question(turns[0], True), references=tuple(spec.references(turns[0])),
                      max_new_tokens=max(lengths) if lengths else int(spec.max_new),  # type: ignore[arg-type]
                      meta={**meta, **self._turn_meta(turns[0])}, followups=follow, turn_lengths=lengths)

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per line of the file, its turns as the sample's questions. A repoqa turn is scored against
        every function the file asks for in the same repository (SCBench's needles)."""
        [(_, path)] = self.data_files()
        lines = [(line, row, self._check(f"{self.name}: {path}:{line}", row)) for line, row in jsonl_objects(path)]
        needles: dict[str, list[list[str]]] = {}
        for _, row, turns in lines:
            for t in turns:
                if self._asks_function(t):
                    needles.setdefault(row["repo"], []).append([str(t["name"]), str(t["answer"])])
        out = [self._row(line, row, turns, needles) for line, row, turns in lines]
        return out[: self.limit] if self.limit is not None else out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """The task's own SCBench score (a mixed task: the turn's sub-task's), :mod:`kdeval.evals.benchmarks.scbench.specs`."""
        try:
            return ScoreResult(score=float(self.spec.score(prediction, list(references), meta)))
        except (KeyError, TypeError, ValueError) as e:
            raise EvalError(f"{self.name}: cannot score (meta {sorted(meta)}): {type(e).__name__}: {e}; expected "
                            f"the fields a row of this task carries") from None

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The score (%), overall and per turn; a mixed task's also per sub-task."""
        out = {"score": percent(float(r["score"]) for r in rows), "n": len(rows),
               "by_turn": group_percent(rows, ["turn"])}
        if self.spec.mixed:
            out["by_subtask"] = group_percent(rows, ["subtask"])
        return out
