"""Fixtures of the report tests: a fresh index and results directory per test."""
from __future__ import annotations

from pathlib import Path

import pytest

from kdeval.storage import RunIndex


@pytest.fixture
def store(tmp_path: Path):
    """(index, results dir) in a temp directory."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    yield idx, tmp_path / "results"
    idx.close()
