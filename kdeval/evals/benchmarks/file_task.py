"""``file``: a task over the user's own JSONL, Parquet or CSV file, described by data only (no code).

Each row is one sample: its ``context`` (compressed; what ``compress: context`` compresses), its ``question`` (kept
under ``compress: context``), its acceptable ``answers`` (a string or a list), and optionally an ``answer_prefix``
(text the answer starts with) and its own ``max_new_tokens``. ``fields`` maps these names to the file's columns;
the defaults are kvpress's dataset layout (``context``, ``question``, ``answer``, ``answer_prefix``,
``max_new_tokens``; ``task`` and other columns are kept in the rows' meta), so a kvpress DataFrame saved to Parquet
or JSONL is read as it is. ``template`` writes the prompt from named fields, ``{context}`` once, ``{question}`` and
any column by name (``str.format`` fields only: no attribute or index access, no code). ``metric`` names one of
:mod:`kdeval.evals.metrics.registry`. Like LongBench, samples have their natural lengths, truncated in the middle
to what the model takes. A cell's identity holds the file's bytes' digest.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

from kdeval.evals.metrics.registry import get_metric
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, Task, check_positive
from kdeval.evals.tasks.data import find_data_file
from kdeval.evals.tasks.prompting import split_at_context
from kdeval.evals.tasks.table_file import read_rows

#: what a row gives a sample -> the column kvpress's datasets hold it in
KVPRESS_FIELDS = {"context": "context", "question": "question", "answers": "answer",
                  "answer_prefix": "answer_prefix", "max_new_tokens": "max_new_tokens", "id": "id"}
REQUIRED = ("context", "question", "answers")
DEFAULT_TEMPLATE = "{context}\n\n{question}"  # kvpress's pipeline: the context, then the question


@dataclass
class FileTask(Task):
    """Args:
        path: the data file (``.jsonl``, ``.parquet`` or ``.csv``): absolute, relative to the working directory
            (a local Ray's workers share the driver's), or else to the data directory (``$KDEVAL_DATA_DIR``); on a
            cluster, a path every node has.
        fields: column names of the sample's fields that differ from kvpress's (``{context: passage, answers:
            gold}``).
        template: the prompt, from ``{context}`` (once), ``{question}`` and other columns by name.
        metric: a metric of the registry (``kdeval.evals.metrics.registry``).
        max_new_tokens: tokens to generate where a row has no ``max_new_tokens`` of its own.
        limit: keep only the first ``limit`` rows.
    """

    path: str = ""
    fields: dict = field(default_factory=dict)
    template: str = DEFAULT_TEMPLATE
    metric: str = "string_match_part"
    max_new_tokens: int = 32
    limit: int | None = None

    def __post_init__(self) -> None:
        self.name = "file"
        if not self.path:
            raise EvalError("path: expected the task's data file (.jsonl, .parquet or .csv)")
        unknown = sorted(set(self.fields) - set(KVPRESS_FIELDS))
        if unknown:
            raise EvalError(f"fields.{unknown[0]}: unknown; expected some of {', '.join(KVPRESS_FIELDS)}")
        check_positive("max_new_tokens", self.max_new_tokens)
        check_positive("limit", self.limit, allow_none=True)
        try:
            get_metric(self.metric)
        except ValueError as e:
            raise EvalError(str(e)) from None
        self._check_template()
        rows = self._rows  # read here: a missing column fails at submit, before any model loads
        columns = set(rows[0])
        for name in REQUIRED:
            column = self._column(name)
            missing = next((i for i, r in enumerate(rows) if column not in r or r[column] is None), None)
            if missing is not None:
                raise EvalError(f"path: {Path(self.path).name}: row {missing} has no column {column!r} (the "
                                f"sample's {name}; map another with fields.{name}; columns: "
                                f"{', '.join(sorted(columns))})")
        for named in self._template_fields - {"context", "question"}:
            if named not in columns:
                raise EvalError(f"template: field {{{named}}} is no column of {Path(self.path).name} (columns: "
                                f"{', '.join(sorted(columns))})")

    def _column(self, name: str) -> str:
        return self.fields.get(name, KVPRESS_FIELDS[name])

    @cached_property
    def _template_fields(self) -> set[str]:
        return {f for _, f, _, _ in string.Formatter().parse(self.template) if f is not None}

    def _check_template(self) -> None:
        try:
            names = [f for _, f, spec, conv in string.Formatter().parse(self.template) if f is not None]
        except ValueError as e:
            raise EvalError(f"template: not a format string ({e})") from None
        if names.count("context") != 1:
            raise EvalError("template: expected the field {context} exactly once")
        bad = next((n for n in names if not n.isidentifier()), None)
        if bad is not None:
            raise EvalError(f"template: field {{{bad}}}: expected a column name (no attribute or index access)")

    @cached_property
    def _file(self) -> Path:
        path = Path(self.path).expanduser()
        if not path.is_absolute() and not path.exists():
            return find_data_file(None, self.path) or path
        return path

    @cached_property
    def _rows(self) -> list[dict[str, Any]]:
        rows = read_rows(self._file)
        return rows[: self.limit] if self.limit is not None else rows

    def data_files(self) -> list[tuple[str, Any]]:
        path = self._file.resolve()
        return [(path.name, path)]

    def data_source(self) -> str:
        return f"file {Path(self.path).name}"

    def generation_length(self) -> int:
        column = self._column("max_new_tokens")
        own = [int(r[column]) for r in self._rows if r.get(column) is not None]
        return max(own, default=self.max_new_tokens)

    def samples(self, builder: Any = None) -> list[Sample]:
        """One sample a row, in file order: the template split after the context, the question the suffix."""
        out = []
        new_col, prefix_col, id_col = (self._column(n) for n in ("max_new_tokens", "answer_prefix", "id"))
        for i, row in enumerate(self._rows):
            answers = row[self._column("answers")]
            # one answer (a string, or a number CSV typed) or a list of them
            answers = [str(a) for a in answers] if isinstance(answers, (list, tuple)) else [str(answers)]
            values = {k: "" if v is None else str(v) for k, v in row.items() if k != "context"}
            values["question"] = str(row[self._column("question")])
            prefix, suffix = split_at_context(self.template, str(row[self._column("context")]), **values)
            sid = row.get(id_col)
            meta = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool)) and k not in (
                self._column("context"),)}
            out.append(Sample(
                id=f"file/{sid if sid not in (None, '') else i}", prefix=prefix, suffix=suffix,
                references=tuple(answers), answer_prefix=str(row.get(prefix_col) or ""),
                max_new_tokens=int(row[new_col]) if row.get(new_col) is not None else self.max_new_tokens,
                meta=meta,
            ))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        return ScoreResult(score=float(get_metric(self.metric)(prediction, list(references))))
