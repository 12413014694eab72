"""Where task data lives: the data directory (``KDEVAL_DATA_DIR``, or ``data_dir=`` in Python) and its files."""
from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

from kdeval.evals.tasks.base import DataNotFoundError, check_choice, check_positive

ENV_VAR = "KDEVAL_DATA_DIR"


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    """The data directory: ``data_dir`` if given, else ``$KDEVAL_DATA_DIR``, else None."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else None


def find_data_file(data_dir: str | os.PathLike[str] | None, relative: str) -> Path | None:
    """``<data dir>/<relative>`` when it exists, else None."""
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    path = root / relative
    return path if path.is_file() else None


def require_data_file(data_dir: str | os.PathLike[str] | None, relative: str, how_to_get: str) -> Path:
    """``<data dir>/<relative>``, or a :class:`DataNotFoundError` naming the file and how to get it."""
    root = resolve_data_dir(data_dir)
    if root is None:
        raise DataNotFoundError(
            f"no data directory: set {ENV_VAR} (data_dir=... in Python); "
            f"looked for <data dir>/{relative}. {how_to_get}"
        )
    path = root / relative
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}. {how_to_get}")
    return path


def jsonl_objects(path: Path, error: type[Exception] = DataNotFoundError) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of a JSON-lines file (blank lines skipped); ``error`` names the file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSON-lines data file (blank lines skipped); errors name the file and line."""
    for _, row in jsonl_objects(path):
        yield row


class LocalOrHub:
    """Mixin of a task whose samples come from files of the data directory (:attr:`local_files`) or, with
    ``source="hub"``, from the hub dataset :attr:`hub_id`: its checks, the files its cells hash and the source
    they report. The task (a dataclass :class:`kdeval.evals.tasks.base.Task`) has the fields ``data_dir``, ``source``
    (``"local"`` or ``"hub"``) and ``limit``, and states :attr:`local_files`, :attr:`hub_id` and
    :attr:`how_to_get` (what a missing-file error says), as class or instance attributes."""

    hub_id: str
    local_files: tuple[str, ...]
    how_to_get: str
    #: what of the hub dataset the task reads, when not all of it (the data source says it in brackets)
    hub_part: str | None = None

    def check_source(self) -> None:
        """Check ``source`` and ``limit`` (an error naming the field)."""
        check_choice("source", self.source, ("local", "hub"))
        check_positive("limit", self.limit, allow_none=True)

    def require_local(self) -> None:
        """With ``source="local"``: a :class:`DataNotFoundError` unless every file is there (before a model loads)."""
        if self.source == "local":
            self.data_files()

    def sample_ids(self) -> list[str] | None:
        return None if self.source == "hub" else super().sample_ids()

    def data_files(self) -> list[tuple[str, Any]]:
        if self.source == "hub":
            return []
        return [(rel, require_data_file(self.data_dir, rel, self.how_to_get)) for rel in self.local_files]

    @property
    def local_source(self) -> str:
        """The data source with ``source="local"`` (default: the file names)."""
        return " + ".join(self.local_files)

    def data_source(self) -> str:
        if self.source == "local":
            return self.local_source
        return f"hub {self.hub_id}" + (f" ({self.hub_part})" if self.hub_part else "")

    def file_rows(self, from_hub: Callable[[int, str], list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """The rows of each of :attr:`local_files` (JSON lines), or, with ``source="hub"``, ``from_hub(i, what)``
        for the ``i``-th (``what`` names the task in errors)."""
        if self.source == "hub":
            return [from_hub(i, f"task {self.name}") for i in range(len(self.local_files))]
        return [list(read_jsonl(path)) for _, path in self.data_files()]

    def first(self, rows: list[Any]) -> list[Any]:
        """The first ``limit`` of ``rows`` (all without a limit)."""
        return rows[: self.limit] if self.limit is not None else rows


@dataclass
class LocalOrHubData(LocalOrHub):
    """:class:`LocalOrHub` with its fields, first of the task's.

    Args:
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        source: ``"local"`` or ``"hub"``.
        limit: keep only the first ``limit`` samples.
    """

    data_dir: str | None = None
    source: str = "local"
    limit: int | None = None


@dataclass
class LocalOrHubSubset(LocalOrHub):
    """:class:`LocalOrHub` for one subset of a benchmark (task ``<benchmark>.<subset>``), which states the rest in
    :meth:`subset_data`.

    Args:
        subset: one of :attr:`subsets`.
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        source: ``"local"`` or ``"hub"``.
        limit: keep only the first ``limit`` questions.
    """

    benchmark: ClassVar[str]
    subsets: ClassVar[tuple[str, ...]]

    subset: str
    data_dir: str | None = None
    source: str = "local"
    limit: int | None = None

    def __post_init__(self) -> None:
        check_choice("subset", self.subset, self.subsets)
        self.check_source()
        self.name = f"{self.benchmark}.{self.subset}"
        self.local_files, self.hub_part, self.how_to_get = self.subset_data()
        self.require_local()

    def subset_data(self) -> tuple[tuple[str, ...], str, str]:
        """The subset's :attr:`local_files`, :attr:`hub_part` and :attr:`how_to_get`."""
        raise NotImplementedError
