"""LongBench v2: 503 multiple-choice questions over 8K-2M-word contexts (THUDM/LongBench, v2).

Prompt: the official zero-shot template (``prompts/0shot.txt``) as the user message; 128 new tokens (the
official non-CoT length); the prompt is truncated in the middle to the model's context as the official
``pred.py`` does. Score: the official answer extraction (:mod:`kdeval.evals.metrics.longbench2`).

Data: the official ``data.json`` (a JSON list of rows ``_id, domain, sub_domain, difficulty, length,
question, choice_A..choice_D, answer, context``) at ``<data dir>/longbench2/data.json``, or, with
``source="hub"``, the hub dataset ``THUDM/LongBench-v2`` (split ``train``, as the official ``pred.py`` loads it).
An empty generation scores 0 here; the official ``pred.py`` drops such a question from its results.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from kdeval.evals.metrics.longbench2 import accuracy_table, extract_choice
from kdeval.evals.tasks.base import DataNotFoundError, Sample, ScoreResult, Task, check_positive, row_field
from kdeval.evals.tasks.data import LocalOrHubData
from kdeval.evals.tasks.hub import hub_rows

#: prompts/0shot.txt of the official repository, verbatim; $DOC$ is the context
TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
MAX_NEW_TOKENS = 128
DATA_FILE = "longbench2/data.json"
HUB_ID = "THUDM/LongBench-v2"
_FIELDS = ("_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context")
_HOW_TO_GET = (
    "It is the official data.json (the hub dataset THUDM/LongBench-v2); put it at <data dir>/longbench2/data.json "
    "or set the task's `params: {source: hub}` to download it when online."
)


def render_prompt(row: Mapping[str, str]) -> tuple[str, str]:
    """The official prompt of one row split after its context: (prefix, suffix). Fields are stripped, as there."""
    head, tail = TEMPLATE.split("$DOC$", 1)
    for key, field in (("$Q$", "question"), ("$C_A$", "choice_A"), ("$C_B$", "choice_B"),
                       ("$C_C$", "choice_C"), ("$C_D$", "choice_D")):
        tail = tail.replace(key, row[field].strip())
    return head + row["context"].strip(), tail


@dataclass
class LongBench2Task(LocalOrHubData, Task):
    """LongBench v2 (headline: accuracy overall, by difficulty and by length, as the official ``result.py``).

    Args:
        data_dir, source, limit: as :class:`LocalOrHubData` (local: ``longbench2/data.json``).
        max_new_tokens: generation length (official: 128; raise it for reasoning models).
    """

    local_files: ClassVar[tuple[str, ...]] = (DATA_FILE,)
    hub_id: ClassVar[str] = HUB_ID
    how_to_get: ClassVar[str] = _HOW_TO_GET

    max_new_tokens: int = MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        self.check_source()
        check_positive("max_new_tokens", self.max_new_tokens)
        self.name = "longbench2"
        self.require_local()

    def _rows(self) -> list[dict[str, Any]]:
        if self.source == "hub":  # as the official pred.py loads it
            path, rows = HUB_ID, hub_rows(HUB_ID, None, "train", "task longbench2")
        else:
            [(_, path)] = self.data_files()
            with open(path, encoding="utf-8") as f:
                try:
                    rows = json.load(f)
                except json.JSONDecodeError as e:
                    raise DataNotFoundError(f"{path}: not valid JSON ({e.msg}); expected the official data.json list") from None
        if not isinstance(rows, list):
            raise DataNotFoundError(f"{path}: expected a JSON list of questions (the official data.json)")
        for i, row in enumerate(rows):
            missing = [k for k in _FIELDS if not isinstance(row, dict) or k not in row]
            if missing:
                raise DataNotFoundError(f"{path}: question {i} has no field {missing[0]!r}")
        return self.first(rows)

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample per question, in file order; id = the row's ``_id``."""
        out = []
        for row in self._rows():
            prefix, suffix = render_prompt(row)
            out.append(Sample(
                id=f"longbench2/{row['_id']}", prefix=prefix, suffix=suffix, references=(row["answer"],),
                max_new_tokens=self.max_new_tokens,
                meta={"difficulty": row.get("difficulty"), "length_bucket": row.get("length"),
                      "domain": row.get("domain")},
            ))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """1 when the extracted choice is the gold letter; sub-score ``answered`` (a choice was found)."""
        choice = extract_choice(prediction)
        return ScoreResult(score=1.0 if choice is not None and choice in references else 0.0,
                           sub={"answered": 0.0 if choice is None else 1.0})

    def aggregate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``accuracy`` and the official table (overall, easy, hard, short, medium, long), in percent."""
        flat = [{"score": r["score"], "difficulty": row_field(r, "difficulty"),
                 "length_bucket": row_field(r, "length_bucket")} for r in rows]
        table = accuracy_table(flat)
        return {"accuracy": table["overall"], "n": len(rows),
                "by_difficulty": {k: table[k] for k in ("easy", "hard")},
                "by_length": {k: table[k] for k in ("short", "medium", "long")}}
