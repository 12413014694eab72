"""Versions of the code: the whole package's (provenance) and the part that computes a cell's result (identity).

A cell's result depends on the engine, its policy, the tasks and metrics and the cell execution, and on
nothing else of ours: the CLI, the scheduler, storage and reports may change without recomputing a cell.
:func:`result_code_hash` hashes exactly those files; :func:`source_hash` hashes every ``.py`` file and is
recorded beside each result (provenance), not hashed into its id.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from kdeval import __version__

PACKAGE_ROOT = Path(__file__).resolve().parent

#: Package-relative files and folders whose code computes every cell's result, whatever its policy (the zoo
#: builds the model and its tokenizer). The engine folder's policy modules are left out here and hashed only into their own policies' cells.
ENGINE_CODE = ("keydiff", "zoo", "baselines/registry.py")
TASK_CODE = ("evals",)
EXECUTION_CODE = ("cluster/execute.py",)
#: what a ``stub:`` model's cells run instead of the engine (hashed into those cells only)
STUB_CODE = ("cluster/stub.py",)


def _py_files(root: Path, rel: str) -> list[str]:
    """Package-relative ``.py`` paths of a file or of every file below a folder."""
    path = root / rel
    if path.is_file():
        return [rel]
    return sorted(p.relative_to(root).as_posix() for p in path.rglob("*.py"))


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> bytes:
    """sha256 of one file's bytes (cached per path, size and modification time: a grid's cells share files)."""
    return hashlib.sha256(Path(path).read_bytes()).digest()


def files_hash(root: Path, relpaths: Iterable[str]) -> str:
    """sha256 (12 hex digits) of the named files under ``root``, by relative path and content."""
    digest = hashlib.sha256()
    for rel in sorted(set(relpaths)):
        st = (root / rel).stat()
        digest.update(rel.encode() + b"\0" + _file_digest(str(root / rel), st.st_size, st.st_mtime_ns) + b"\0")
    return digest.hexdigest()[:12]


def tree_hash(root: Path) -> str:
    """sha256 (12 hex digits) of every ``.py`` file under ``root``, by relative path."""
    return files_hash(root, (p.relative_to(root).as_posix() for p in root.rglob("*.py")))


@lru_cache(maxsize=1)
def source_hash() -> str:
    """:func:`tree_hash` of the installed ``kdeval`` package (computed once per process)."""
    return tree_hash(PACKAGE_ROOT)


def code_version() -> str:
    """``"0.1.0+<source hash>"``: the whole package (fits the index's 32-character column)."""
    return f"{__version__}+{source_hash()}"


def result_code_files(policy_files: Iterable[str], every_policy_file: Iterable[str],
                      root: Path = PACKAGE_ROOT, stub: bool = False) -> list[str]:
    """The files a cell's result depends on: engine (less every policy module in it), tasks, execution, and
    ``policy_files`` (package-relative modules of the cell's policy class and its bases); ``stub``: a ``stub:``
    model's cell, which also runs the stub workload."""
    own = set(policy_files)
    others = set(every_policy_file) - own
    files = set(own)
    for rel in ENGINE_CODE + TASK_CODE + EXECUTION_CODE + (STUB_CODE if stub else ()):
        files.update(f for f in _py_files(root, rel) if f not in others)
    return sorted(files)


def result_code_hash(policy_files: Iterable[str], every_policy_file: Iterable[str],
                     root: Path = PACKAGE_ROOT, stub: bool = False) -> str:
    """:func:`files_hash` of :func:`result_code_files`."""
    return files_hash(root, result_code_files(policy_files, every_policy_file, root, stub))
