"""The code version that goes into every cell id: the release plus a hash of the package's source.

A cell's result depends on the code that computed it, so two checkouts that differ in any ``.py`` file of
the package get different cell ids (a nightly run after a change recomputes; one without a change reuses).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from kdeval import __version__


def tree_hash(root: Path) -> str:
    """sha256 (12 hex digits) of every ``.py`` file under ``root``, by relative path."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@lru_cache(maxsize=1)
def source_hash() -> str:
    """:func:`tree_hash` of the installed ``kdeval`` package (computed once per process)."""
    return tree_hash(Path(__file__).resolve().parent)


def code_version() -> str:
    """``"0.1.0+<source hash>"`` (fits the index's 32-character column)."""
    return f"{__version__}+{source_hash()}"
