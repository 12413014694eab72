"""InfiniteBench En.QA and En.MC (OpenBMB/InfiniteBench): questions on 100K+-token novels.

Prompts: InfiniteBench's templates for open models (``src/prompt.py``, ``yarn_mistral_templates``, which its
Yi-200K and ChatGLM3 runs use too); generation lengths from ``src/eval_utils.py``; scores from
``src/compute_scores.py`` (:mod:`kdeval.evals.metrics.infinitebench`). Prompts longer than the model's context
are truncated in the middle, as its ``truncate_by_tokens``.

Data: the official ``<task file>.jsonl`` (rows ``id, context, input, answer, options``) at
``<data dir>/infinitebench/``, or, with ``source="hub"``, the same file of the hub dataset
``xinrongzhang2022/InfiniteBench``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.metrics.infinitebench import choice_match, qa_f1
from kdeval.evals.tasks.base import DataNotFoundError, EvalError, Sample, ScoreResult, Task
from kdeval.evals.tasks.data import LocalOrHubSubset, read_jsonl
from kdeval.evals.tasks.hub import hub_file
from kdeval.evals.tasks.prompting import split_at_context

HUB_ID = "xinrongzhang2022/InfiniteBench"
#: kdeval name -> (official task and file name, yarn_mistral template verbatim, official max_new_tokens)
TASKS: dict[str, tuple[str, str, int]] = {
    "en_qa": ("longbook_qa_eng", "Read the book and answer the question. Be very concise in your answer.\n\n"
              "{context}\n\nQuestion: {question}\nAnswer:", 40),
    "en_mc": ("longbook_choice_eng", "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n"
              "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is", 40),
}


def mc_labels(row: Mapping[str, Any]) -> list[str]:
    """En.MC's labels: [gold option text, its letter] (the official ``get_answer``)."""
    answer, options = row["answer"], row.get("options") or []
    if isinstance(answer, list) and len(answer) == 2 and answer[1] in ("A", "B", "C", "D"):
        return [str(a) for a in answer]
    text = answer[0] if isinstance(answer, list) and len(answer) == 1 else answer
    if not isinstance(text, str) or text not in options:
        raise DataNotFoundError(f"answer {answer!r} is not one of the options {options!r}")
    return [text, "ABCD"[options.index(text)]]


@dataclass
class InfiniteBenchTask(LocalOrHubSubset, Task):
    """One data-backed InfiniteBench task (headline: 100 × mean score, rounded to 2); ``subset``: ``en_qa`` or
    ``en_mc``."""

    benchmark: ClassVar[str] = "infinitebench"
    subsets: ClassVar[tuple[str, ...]] = tuple(TASKS)
    hub_id: ClassVar[str] = HUB_ID

    def subset_data(self) -> tuple[tuple[str, ...], str, str]:
        self._file = f"{TASKS[self.subset][0]}.jsonl"
        return ((f"infinitebench/{self._file}",), self._file,
                f"It is {self._file} of the hub dataset {HUB_ID}; put it at <data dir>/infinitebench/{self._file} "
                "or set the task's `params: {source: hub}` to download it when online.")

    def _rows(self) -> list[dict[str, Any]]:
        [rows] = self.file_rows(lambda _, what: list(read_jsonl(hub_file(HUB_ID, self._file, what))))
        return self.first(rows)

    def generation_length(self) -> int:
        return TASKS[self.subset][2]

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per row, in file order, with the official prompt split after the context."""
        _, template, max_new = TASKS[self.subset]
        out = []
        for i, row in enumerate(self._rows()):
            for key in ("context", "input", "answer"):
                if key not in row:
                    raise DataNotFoundError(f"{self.name}: row {i} has no field {key!r} (expected InfiniteBench rows)")
            fields = {"question": row["input"]}
            if self.subset == "en_mc":
                options = row.get("options") or []
                if len(options) != 4:
                    raise DataNotFoundError(f"{self.name}: row {i} has {len(options)} options, expected 4")
                fields.update({f"OPTION_{c}": o for c, o in zip("ABCD", options)})
                try:
                    labels = mc_labels(row)
                except DataNotFoundError as e:
                    raise DataNotFoundError(f"{self.name}: row {i}: {e}") from None
            else:
                labels = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
            prefix, suffix = split_at_context(template, row["context"], **fields)
            out.append(Sample(id=f"{self.name}/{row.get('id', i)}", prefix=prefix, suffix=suffix,
                              references=tuple(str(a) for a in labels), max_new_tokens=max_new))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """En.QA: best token F1 over the answers; En.MC: the official choice rules (references = text, letter)."""
        if self.subset == "en_qa":
            return ScoreResult(score=qa_f1(prediction, references))
        if len(references) != 2:
            raise EvalError(f"{self.name}: references must be [gold option text, gold letter], got {list(references)}")
        return ScoreResult(score=1.0 if choice_match(prediction, references) else 0.0)
