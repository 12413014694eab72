"""Shared fixtures: the offline data directory and Ray's sandbox settings."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The Ray clusters that tests build themselves (ray.init, cluster_utils): loopback only, no auth service.
# The product's own local Ray sets this by itself: tests/service/test_loopback.py runs it without these.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data directory (MATH-500, Paul Graham essays): KDEVAL_DATA_DIR or ../shared/data."""
    env = os.environ.get("KDEVAL_DATA_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"offline data directory not found: {path} (set KDEVAL_DATA_DIR)")
    return path
