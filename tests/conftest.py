"""Shared fixtures: the offline data directory.

No Ray variable is set here: the product sets what it needs itself, kdeval subprocesses run without any
(``tests/user_env.py``), and the fixtures that build a Ray cluster in this process set its sandbox settings
(``sandbox_ray``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data directory (MATH-500, Paul Graham essays): KDEVAL_DATA_DIR or ../shared/data."""
    env = os.environ.get("KDEVAL_DATA_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"offline data directory not found: {path} (set KDEVAL_DATA_DIR)")
    return path
