"""SCBench (microsoft/MInference ``scbench/``, arXiv 2412.10319): several questions on one shared context, from
its released files.

Data: ``<data dir>/scbench/scbench_<task>.jsonl``, SCBench's format: one JSON object per line with ``context``
(the shared context) and ``multi_turns``, a list of ``{input, answer}`` (``scbench_choice_eng`` also has each
turn's ``options``, four strings); an ``id`` when present names the sample. Each line is a sample whose turns
are its questions (``Task.multi_question``): they run as conversations (multi-turn or multi-request,
:mod:`kdeval.evals.conversation`). SCBench publishes the files on the hub as dataset ``microsoft/SCBench``; its
own ``eval_utils.py`` downloads them from ``huggingface.co/datasets/microsoft/SCBench/resolve/main/data/``.
kdeval reads local files only: download them once, then point the data directory at them.

Prompts: SCBench's multi-turn templates (``multiturn_templates``: the task's instruction, the context, the first
question) and, for the later turns, its chat-template follow-ups (``multiturn_follow_up_templates_in_chat_tempate``:
the question alone, ``Question: ...`` for QA and choice); generation lengths: ``DATA_NAME_TO_MAX_NEW_TOKENS``.
Scores: each task's own (:mod:`kdeval.evals.metrics.scbench`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

from kdeval.evals.base import DataNotFoundError, Followup, Sample, ScoreResult, Task, check_choice, check_positive
from kdeval.evals.base import group_percent, percent
from kdeval.evals.data import jsonl_objects
from kdeval.evals.metrics.infinitebench import choice_match, digits_match
from kdeval.evals.metrics.scbench import any_upper_match, share_match, substring_match

_KV = "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}"
_PASSKEY = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
            "you about the important information.\n\n{context}")
_QA = "Read the book and answer the question. Be very concise in your answer.\n\n{context}"
_CHOICE = "Read the book and answer the question.\n\n{context}"
_QUESTION = "Question: {input}\nAnswer:"
#: SCBench's first-turn template, spelling kept ("The the")
_OPTIONS = "Question: {input}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\n\nThe the correct answer is"


def _plain(turn: Mapping[str, Any]) -> str:
    return str(turn["input"])


def _qa(turn: Mapping[str, Any]) -> str:
    return _QUESTION.format(input=turn["input"])


def _choice(turn: Mapping[str, Any]) -> str:
    a, b, c, d = (str(o) for o in turn["options"])
    return _OPTIONS.format(input=turn["input"], a=a, b=b, c=c, d=d)


def _labels(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _choice_labels(turn: Mapping[str, Any]) -> list[str]:
    """The answer's text and its letter (what InfiniteBench's En.MC metric matches against)."""
    labels = _labels(turn["answer"])
    letters = [("ABCD"[turn["options"].index(x)]) for x in labels if x in turn["options"]]
    return labels + [x for x in letters if x not in labels]


#: task -> (context template, question of a turn, references of a turn, score, max new tokens, turn fields)
TASKS: dict[str, tuple[str, Callable, Callable, Callable, int, tuple[str, ...]]] = {
    "kv": (_KV, _plain, lambda t: _labels(t["answer"]), substring_match, 150, ("input", "answer")),
    "prefix_suffix": ("{context}", _plain, lambda t: _labels(t["answer"]), substring_match, 150, ("input", "answer")),
    "vt": ("{context}", _plain, lambda t: _labels(t["answer"]), share_match, 30, ("input", "answer")),
    "passkey": (_PASSKEY, _plain, lambda t: _labels(t["answer"]),
                lambda p, refs: float(digits_match(p, refs[0])), 15, ("input", "answer")),
    "qa_eng": (_QA, _qa, lambda t: _labels(t["answer"]), any_upper_match, 40, ("input", "answer")),
    "many_shot": ("{context}", _plain, lambda t: _labels(t["answer"]), any_upper_match, 10, ("input", "answer")),
    "choice_eng": (_CHOICE, _choice, _choice_labels, lambda p, refs: float(choice_match(p, refs)), 40,
                   ("input", "answer", "options")),
}


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
        self.data_files()

    @property
    def file(self) -> str:
        return f"scbench/scbench_{self.subset}.jsonl"

    def data_files(self) -> list[tuple[str, Any]]:
        from kdeval.evals.data import require_data_file

        how = (f"It is SCBench's scbench_{self.subset}.jsonl (hub dataset microsoft/SCBench, folder data/); put it at "
               f"<data dir>/{self.file}")
        return [(self.file, require_data_file(self.data_dir, self.file, how))]

    def data_source(self) -> str:
        return self.file

    def generation_length(self) -> int:
        return TASKS[self.subset][4]

    def _row(self, path: Any, line: int, row: Mapping[str, Any]) -> Sample:
        template, question, references, _, max_new, fields = TASKS[self.subset]
        where = f"{self.name}: {path}:{line}"
        if not isinstance(row.get("context"), str):
            raise DataNotFoundError(f"{where}: field 'context' is missing or not text (expected SCBench rows "
                                    f"{{context, multi_turns: [{{input, answer}}]}})")
        turns = row.get("multi_turns")
        if not isinstance(turns, list) or not turns:
            raise DataNotFoundError(f"{where}: field 'multi_turns' is missing or empty (expected a list of "
                                    f"{{{', '.join(fields)}}})")
        for k, turn in enumerate(turns):
            missing = [f for f in fields if not isinstance(turn, dict) or turn.get(f) in (None, "", [])]
            if missing:
                raise DataNotFoundError(f"{where}: multi_turns[{k}] has no field '{missing[0]}' (expected "
                                        f"{{{', '.join(fields)}}})")
            if "options" in fields and (not isinstance(turn["options"], list) or len(turn["options"]) != 4):
                raise DataNotFoundError(f"{where}: multi_turns[{k}].options: expected a list of 4 options")
        turns = turns[: self.max_turns]
        prefix = template.format(context=row["context"])
        follow = tuple(Followup("\n\n" + question(t), tuple(references(t))) for t in turns[1:])
        return Sample(id=f"{self.name}/{row.get('id', line - 1)}", prefix=prefix, suffix="\n\n" + question(turns[0]),
                      references=tuple(references(turns[0])), max_new_tokens=max_new, followups=follow)

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per line of the file, its turns as the sample's questions."""
        [(_, path)] = self.data_files()
        out = [self._row(path, line, row) for line, row in jsonl_objects(path)]
        return out[: self.limit] if self.limit is not None else out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """The task's own SCBench score (:mod:`kdeval.evals.metrics.scbench`)."""
        return ScoreResult(score=float(TASKS[self.subset][3](prediction, list(references))))

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The score (%), overall and per turn."""
        return {"score": percent(float(r["score"]) for r in rows), "n": len(rows),
                "by_turn": group_percent(rows, ["turn"])}
