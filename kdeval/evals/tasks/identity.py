"""What a task instance will run, known before any model loads: its sample ids, a digest of the data it reads,
where that data comes from and how long it generates. Cell identity and dry runs are built from it.

    task = get_task("math500", limit=8)
    info = task_data(task, samples=8, max_new_tokens=None)
    info.sample_ids, info.digest, info.source, info.generation_length
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kdeval.evals.tasks.base import Task


@dataclass(frozen=True)
class TaskData:
    """One task instance as a cell sees it.

    Attributes:
        sample_ids: the ids of the samples the cell runs (the first ``samples`` of the task's), or None when
            they are only known once hub data is fetched.
        available: how many samples the task has (None with ``sample_ids``).
        digest: sha256 (16 hex digits) of the data source and the bytes of every file the samples are read from.
        source: where the samples come from (machine-independent words, e.g. ``math500/test.jsonl``).
        generation_length: tokens generated per sample (the grid's ``max_new_tokens`` or the benchmark's own).
    """

    sample_ids: tuple[str, ...] | None
    available: int | None
    digest: str
    source: str
    generation_length: int


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes (cached per path, size and modification time)."""
    st = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def data_digest(task: Task) -> str:
    """Digest of where ``task``'s samples come from and of the bytes of the files it reads (names relative to
    the data directory, so the same data in another directory gives the same digest)."""
    digest = hashlib.sha256(task.data_source().encode("utf-8"))
    for rel, path in sorted(task.data_files()):
        digest.update(b"\0" + rel.encode("utf-8") + b"\0" + file_sha256(path).encode("ascii"))
    return digest.hexdigest()[:16]


def task_data(task: Task, samples: int, max_new_tokens: int | None) -> TaskData:
    """:class:`TaskData` of ``task`` when a cell runs its first ``samples`` samples."""
    ids = task.sample_ids()
    return TaskData(
        sample_ids=None if ids is None else tuple(ids[:samples]),
        available=None if ids is None else len(ids),
        digest=data_digest(task),
        source=task.data_source(),
        generation_length=max_new_tokens if max_new_tokens is not None else task.generation_length(),
    )
