"""Where task data lives: the data directory (``KDEVAL_DATA_DIR``, or ``data_dir=`` in Python) and its files."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Iterator

from kdeval.evals.base import DataNotFoundError

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


class OneFileOrHub:
    """Mixin of a task whose samples come from one file of the data directory (:attr:`data_file`) or, with
    ``source="hub"``, from the hub (:attr:`hub_id`): what its cells hash and report as their data.
    The task class (a :class:`kdeval.evals.base.Task`) has ``source`` and ``data_dir`` fields."""

    data_file: ClassVar[str]
    hub_id: ClassVar[str]
    how_to_get: ClassVar[str]

    def sample_ids(self) -> list[str] | None:
        return None if self.source == "hub" else super().sample_ids()

    def data_files(self) -> list[tuple[str, Any]]:
        if self.source == "hub":
            return []
        return [(self.data_file, require_data_file(self.data_dir, self.data_file, self.how_to_get))]

    def data_source(self) -> str:
        return f"hub {self.hub_id}" if self.source == "hub" else self.data_file
