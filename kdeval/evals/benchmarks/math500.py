"""MATH-500: the answer is the last ``\\boxed{}`` of the generation, graded by math equivalence.

Data: ``<data dir>/math500/test.jsonl`` (rows: problem, solution, answer, subject, level,
unique_id) or, with ``source="hub"``, the hub dataset ``HuggingFaceH4/MATH-500``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.metrics.math_equiv import last_boxed, math_equal
from kdeval.evals.tasks.base import (
    EvalError, Sample, ScoreResult, Task, check_positive, group_percent, percent, row_field,
)
from kdeval.evals.tasks.data import LocalOrHubData
from kdeval.evals.tasks.hub import hub_rows

#: the instruction the Qwen2.5-Math / DeepSeek-R1 evaluations append to each problem
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
#: The maximum generation length of the DeepSeek-R1 evaluation (AIME 2024, MATH-500 ...): reasoning models' length
REASONING_MAX_NEW_TOKENS = 32768
DATA_FILE = "math500/test.jsonl"
HUB_ID = "HuggingFaceH4/MATH-500"
_HOW_TO_GET = (
    "It is the MATH-500 test split (prm800k math_splits/test.jsonl, also hub HuggingFaceH4/MATH-500); "
    "put it at <data dir>/math500/test.jsonl or set the task's `params: {source: hub}` when online."
)


@dataclass
class Math500Task(LocalOrHubData, Task):
    """MATH-500 with chain-of-thought generation.

    Args:
        data_dir, source, limit: as :class:`LocalOrHubData` (limit: the first ``limit`` problems).
        max_new_tokens: generation budget for the reasoning and the answer.
    """

    local_files: ClassVar[tuple[str, ...]] = (DATA_FILE,)
    hub_id: ClassVar[str] = HUB_ID
    how_to_get: ClassVar[str] = _HOW_TO_GET

    max_new_tokens: int = 1024

    #: with ``generation: {thinking: strip}`` and no grid length: the DeepSeek-R1 evaluation's length
    reasoning_max_new_tokens = REASONING_MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        self.check_source()
        check_positive("max_new_tokens", self.max_new_tokens)
        self.name = "math500"
        self.require_local()

    def rows(self) -> list[dict[str, Any]]:
        """The dataset rows."""
        [rows] = self.file_rows(lambda _, what: hub_rows(HUB_ID, None, "test", what))
        return self.first(rows)

    #: the problem is the question: there is no context to compress apart from it
    separable_question = False

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per problem; id = the row's unique_id."""
        out = []
        for i, r in enumerate(self.rows()):
            for key in ("problem", "answer"):
                if key not in r:
                    raise EvalError(f"math500: row {i} has no field {key!r}")
            out.append(Sample(
                id=f"math500/{r.get('unique_id') or i}",
                prefix=r["problem"],
                suffix=INSTRUCTION,
                references=(r["answer"],),
                max_new_tokens=self.max_new_tokens,
                meta={"subject": r.get("subject"), "level": r.get("level")},
            ))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """1 when the last boxed answer equals a reference; sub-score ``has_boxed``."""
        return boxed_score(prediction, references)

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Accuracy (%), boxed rate (%), and accuracy per level."""
        out: dict[str, Any] = {
            "accuracy": percent(float(r["score"]) for r in rows),
            "boxed_rate": percent(float(r.get("has_boxed", 0.0)) for r in rows),
            "n": len(rows),
        }
        if any(row_field(r, "level") is not None for r in rows):
            out["accuracy_by_level"] = group_percent(rows, ["level"])
        return out


def boxed_score(prediction: str, references: Sequence[str]) -> ScoreResult:
    """1 when the last ``\\boxed{}`` of ``prediction`` is math-equal to a reference; sub-score ``has_boxed``."""
    answer = last_boxed(prediction)
    ok = any(math_equal(answer, ref) for ref in references)
    return ScoreResult(score=1.0 if ok else 0.0, sub={"has_boxed": 0.0 if answer is None else 1.0})
