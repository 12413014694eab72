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
from typing import Any, Mapping, Sequence

from kdeval.evals.base import EvalError, Sample, ScoreResult, Task, check_choice, check_positive, percent
from kdeval.evals.data import read_jsonl, require_data_file
from kdeval.evals.hub import hub_rows
from kdeval.evals.math500 import INSTRUCTION, REASONING_MAX_NEW_TOKENS, boxed_score

HUB_ID = "opencompass/AIME2025"
PARTS = ("I", "II")
_HOW_TO_GET = (
    "They are the test files of the hub dataset opencompass/AIME2025 (configs AIME2025-I and AIME2025-II); put them "
    "at <data dir>/aime2025/aime2025-I.jsonl and aime2025-II.jsonl or set the task's `params: {source: hub}` when online."
)


@dataclass
class Aime2025Task(Task):
    """AIME 2025 with chain-of-thought generation.

    Args:
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        source: ``"local"`` or ``"hub"``.
        limit: keep only the first ``limit`` problems (I before II).
        max_new_tokens: generation budget for the reasoning and the answer.
    """

    data_dir: str | None = None
    source: str = "local"
    limit: int | None = None
    max_new_tokens: int = REASONING_MAX_NEW_TOKENS

    #: the grid's length under ``generation: {thinking: strip}`` when it sets none (the default already is)
    reasoning_max_new_tokens = REASONING_MAX_NEW_TOKENS

    #: the problem is the question: there is no context to compress apart from it
    separable_question = False

    def __post_init__(self) -> None:
        check_choice("source", self.source, ("local", "hub"))
        check_positive("limit", self.limit, allow_none=True)
        check_positive("max_new_tokens", self.max_new_tokens)
        self.name = "aime2025"
        if self.source == "local":
            self.data_files()

    def data_files(self) -> list[tuple[str, Any]]:
        if self.source == "hub":
            return []
        rels = [f"aime2025/aime2025-{part}.jsonl" for part in PARTS]
        return [(rel, require_data_file(self.data_dir, rel, _HOW_TO_GET)) for rel in rels]

    def data_source(self) -> str:
        return f"hub {HUB_ID}" if self.source == "hub" else "aime2025/aime2025-{I,II}.jsonl"

    def sample_ids(self) -> list[str] | None:
        return None if self.source == "hub" else super().sample_ids()

    def _rows(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(part, index in its part, row) of every problem, I before II."""
        out = []
        for part, (_, path) in zip(PARTS, self.data_files() or [(None, None)] * len(PARTS)):
            rows = list(read_jsonl(path)) if path is not None else hub_rows(HUB_ID, f"AIME2025-{part}", "test", "task aime2025")
            out.extend((part, i, row) for i, row in enumerate(rows))
        return out[: self.limit] if self.limit is not None else out

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
