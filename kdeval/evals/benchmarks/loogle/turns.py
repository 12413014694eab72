"""LooGLE documents with their several questions asked as turns of one conversation (``turns.loogle.<subset>``).

The data, prompt, generation length and metric are :mod:`kdeval.evals.benchmarks.loogle.task`'s; one sample per document
(id ``turns.loogle.<subset>/<document index>``) instead of one per question: its first question follows the
document in the official template, each later one is its own turn (``Question: ... Answer:``). Documents with a
single question are still samples (a conversation of one turn). ``max_turns`` keeps a document's first
questions only; ``limit`` keeps the first documents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdeval.evals.benchmarks.loogle.task import MAX_NEW_TOKENS, TEMPLATE, LooGLETask, qa_pairs
from kdeval.evals.tasks.base import DataNotFoundError, Followup, Sample, check_positive
from kdeval.evals.tasks.prompting import split_at_context


@dataclass
class LooGLETurnsTask(LooGLETask):
    """One LooGLE QA task, a document per sample and its questions as turns."""

    max_turns: int | None = None

    multi_question = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("max_turns", self.max_turns, allow_none=True)
        self.name = f"turns.{self.name}"

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per document with at least one question, in file order."""
        out: list[Sample] = []
        for d, row in enumerate(self._rows()):
            if "input" not in row:
                raise DataNotFoundError(f"{self.name}: document {d} has no field 'input' (expected LooGLE rows)")
            try:
                pairs = qa_pairs(row)[: self.max_turns]
            except DataNotFoundError as e:
                raise DataNotFoundError(f"{self.name}: document {d}: {e}") from None
            if not pairs:
                continue
            prefix, suffix = split_at_context(TEMPLATE, row["input"], Q=pairs[0]["Q"])
            follow = tuple(Followup(f"Question: {p['Q']}\nAnswer: ", (p["A"],)) for p in pairs[1:])
            out.append(Sample(id=f"{self.name}/{d}", prefix=prefix, suffix=suffix, references=(pairs[0]["A"],),
                              max_new_tokens=MAX_NEW_TOKENS[self.subset], meta={"title": row.get("title")},
                              followups=follow))
            if self.limit is not None and len(out) == self.limit:
                return out
        return out
