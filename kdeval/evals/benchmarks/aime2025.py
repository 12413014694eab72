"""AIME 2025: the 30 problems of AIME 2025 I and II, graded like MATH-500 (last ``\\boxed{}``, math equivalence;
every answer is an integer from 0 to 999).

Generation length: 32,768 tokens, the maximum generation length of the DeepSeek-R1 evaluation (AIME and
MATH-500); the grid's ``generation.max_new_tokens`` bounds it (the example grids use far less on a CPU).

Data: the hub dataset ``opencompass/AIME2025``'s two test files (rows ``question, answer``) at
``<data dir>/aime2025/aime2025-I.jsonl`` and ``aime2025-II.jsonl``, or, with ``source="hub"``, the dataset
itself (configs ``AIME2025-I`` and ``AIME2025-II``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.benchmarks.math500 import INSTRUCTION, REASONING_MAX_NEW_TOKENS, boxed_score
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, Task, check_positive, percent
from kdeval.evals.tasks.data import LocalOrHubData
from kdeval.evals.tasks.hub import hub_rows

HUB_ID = "opencompass/AIME2025"
PARTS = ("I", "II")
_HOW_TO_GET = (
    "They are the test files of the hub dataset opencompass/AIME2025 (configs AIME2025-I and AIME2025-II); put them "
    "at <data dir>/aime2025/aime2025-I.jsonl and aime2025-II.jsonl or set the task's `params: {source: hub}` when online."
)


@dataclass
class Aime2025Task(LocalOrHubData, Task):
    """AIME 2025 with chain-of-thought generation.

    Args:
        data_dir, source, limit: as :class:`LocalOrHubData` (limit: the first ``limit`` problems, I before II).
        max_new_tokens: generation budget for the reasoning and the answer.
    """

    local_files: ClassVar[tuple[str, ...]] = tuple(f"aime2025/aime2025-{part}.jsonl" for part in PARTS)
    local_source: ClassVar[str] = "aime2025/aime2025-{I,II}.jsonl"
    hub_id: ClassVar[str] = HUB_ID
    how_to_get: ClassVar[str] = _HOW_TO_GET

    max_new_tokens: int = REASONING_MAX_NEW_TOKENS

    #: the grid's length under ``generation: {thinking: strip}`` when it sets none (the default already is)
    reasoning_max_new_tokens = REASONING_MAX_NEW_TOKENS

    #: the problem is the question: there is no context to compress apart from it
    separable_question = False

    def __post_init__(self) -> None:
        self.check_source()
        check_positive("max_new_tokens", self.max_new_tokens)
        self.name = "aime2025"
        self.require_local()

    def _rows(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(part, index in its part, row) of every problem, I before II."""
        parts = self.file_rows(lambda i, what: hub_rows(HUB_ID, f"AIME2025-{PARTS[i]}", "test", what))
        return self.first([(part, i, row) for part, rows in zip(PARTS, parts) for i, row in enumerate(rows)])

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per problem; id = ``aime2025/<part>-<number>``."""
        out = []
        for part, i, row in self._rows():
            problem = row.get("question", row.get("problem"))
            if problem is None or "answer" not in row:
                raise EvalError(f"aime2025: problem {part}-{i + 1} needs fields 'question' and 'answer'")
            out.append(Sample(id=f"aime2025/{part}-{i + 1}", prefix=problem, suffix=INSTRUCTION,
                              references=(str(row["answer"]),), max_new_tokens=self.max_new_tokens,
                              meta={"part": part}))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """As MATH-500: 1 when the last boxed answer equals the reference; sub-score ``has_boxed``."""
        return boxed_score(prediction, references)

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Accuracy (%) and boxed rate (%)."""
        return {"accuracy": percent(float(r["score"]) for r in rows),
                "boxed_rate": percent(float(r.get("has_boxed", 0.0)) for r in rows), "n": len(rows)}
