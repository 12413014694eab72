"""LooGLE short- and long-dependency QA (bigai-nlco/LooGLE): questions on long documents (arXiv papers,
Wikipedia, scripts).

Prompt: the official ``config/task2prompt.json`` template; generation lengths from ``config/task2maxlen.json``
(300 / 500 tokens); prompts over the model's context are truncated in the middle (first and last halves), as
the official ``Prediction/pred_opensource_models.py``. That script decodes with ``repetition_penalty=2``;
kdeval decodes greedily without it, so the numbers compare across policies here, not with the paper's table.
Every question of a document is one sample, and consecutive questions share the document as their context.
Scores: :mod:`kdeval.evals.metrics.loogle` (the headline ``score`` is ROUGE-L recall).

Data: the official test file ``<task>.jsonl`` (rows ``input, title, qa_pairs, output``; ``qa_pairs`` is a
Python-literal list of ``{"Q", "A", "S"}``, read with ``ast.literal_eval``) at ``<data dir>/loogle/``, or,
with ``source="hub"``, the hub dataset ``bigainlco/LooGLE`` (config = task, split test).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.metrics.loogle import loogle_scores
from kdeval.evals.tasks.base import DataNotFoundError, EvalError, Sample, ScoreResult, Task, mean
from kdeval.evals.tasks.data import LocalOrHubSubset
from kdeval.evals.tasks.hub import hub_rows
from kdeval.evals.tasks.prompting import split_at_context

HUB_ID = "bigainlco/LooGLE"
#: config/task2prompt.json (QA tasks), verbatim but for the document field's name ({input} there)
TEMPLATE = "Please answer the question based on the long texts below. \n{context}\nQuestion: {Q}\nAnswer: "
#: config/task2maxlen.json
MAX_NEW_TOKENS = {"shortdep_qa": 300, "longdep_qa": 500}
SUB_SCORES = ("bleu1", "bleu4", "rouge1", "rouge2", "rougeL", "meteor")


def qa_pairs(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's question-answer pairs (``qa_pairs`` as a list, or its official Python-literal text)."""
    pairs = row.get("qa_pairs")
    if isinstance(pairs, str):
        if pairs == "none":
            return []
        try:
            pairs = ast.literal_eval(pairs)
        except (ValueError, SyntaxError) as e:
            raise DataNotFoundError(f"qa_pairs is not a Python-literal list ({type(e).__name__})") from None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) and "Q" in p and "A" in p for p in pairs):
        raise DataNotFoundError("qa_pairs: expected a list of {'Q': ..., 'A': ...}")
    return pairs


@dataclass
class LooGLETask(LocalOrHubSubset, Task):
    """One LooGLE QA task; ``subset``: ``shortdep_qa`` or ``longdep_qa``."""

    benchmark: ClassVar[str] = "loogle"
    subsets: ClassVar[tuple[str, ...]] = tuple(MAX_NEW_TOKENS)
    hub_id: ClassVar[str] = HUB_ID

    def subset_data(self) -> tuple[tuple[str, ...], str, str]:
        return ((f"loogle/{self.subset}.jsonl",), self.subset,
                f"It is LooGLE-testdata/{self.subset}.jsonl of the official repository (also hub {HUB_ID}); put it "
                f"at <data dir>/loogle/{self.subset}.jsonl or set the task's `params: {{source: hub}}` when online.")

    def _rows(self) -> list[dict[str, Any]]:
        [rows] = self.file_rows(lambda _, what: hub_rows(HUB_ID, self.subset, "test", what))
        return rows

    def generation_length(self) -> int:
        return MAX_NEW_TOKENS[self.subset]

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per question, documents in file order; id = document index / question index."""
        out: list[Sample] = []
        for d, row in enumerate(self._rows()):
            if "input" not in row:
                raise DataNotFoundError(f"{self.name}: document {d} has no field 'input' (expected LooGLE rows)")
            try:
                pairs = qa_pairs(row)
            except DataNotFoundError as e:
                raise DataNotFoundError(f"{self.name}: document {d}: {e}") from None
            for q, pair in enumerate(pairs):
                prefix, suffix = split_at_context(TEMPLATE, row["input"], Q=pair["Q"])
                out.append(Sample(id=f"{self.name}/{d}/{q}", prefix=prefix, suffix=suffix, references=(pair["A"],),
                                  max_new_tokens=MAX_NEW_TOKENS[self.subset], meta={"title": row.get("title")}))
                if self.limit is not None and len(out) == self.limit:
                    return out
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """ROUGE-L recall as ``score``; BLEU-1/4, ROUGE-1/2/L and (with WordNet data) METEOR as sub-scores."""
        if len(references) != 1:
            raise EvalError(f"{self.name}: expected one reference answer, got {len(references)}")
        scores = loogle_scores(references[0], prediction)
        return ScoreResult(score=scores["rougeL"], sub=scores)

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Each metric's mean in percent (rounded to 2), as LooGLE's tables; ``score`` is ROUGE-L."""
        out: dict[str, Any] = {"score": round(100 * mean(float(r["score"]) for r in rows), 2), "n": len(rows)}
        for key in SUB_SCORES:
            vals = [float(r[key]) for r in rows if r.get(key) is not None]
            if vals:
                out[key] = round(100 * mean(vals), 2)
        return out
