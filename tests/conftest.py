"""Shared fixtures: the offline data directory; a temp index and results directory (``paths``, or ``store`` opened);
a local Ray for a module; the service commands as a Typer app.

No Ray variable is set here: the product sets what it needs itself, kdeval subprocesses run without any
(``tests/user_env.py``), and the fixtures that build a Ray cluster in this process set its sandbox settings
(``sandbox_ray``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.user_env import sandbox_ray

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


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    """A fresh index file and results directory."""
    return {"db": tmp_path / "index.sqlite", "results": tmp_path / "results", "tmp": tmp_path}


@pytest.fixture(scope="module")
def local_ray():
    """A local 2-CPU Ray for the module (shut down at the end)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    sandbox_ray()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="kdeval-tests",
             logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture
def app():
    """A Typer app with the service commands (submit, status, ls, cancel, resume, rescore)."""
    import typer

    from kdeval.cli import service_cmds

    a = typer.Typer()
    service_cmds.register(a)
    return a


@pytest.fixture
def store(tmp_path: Path):
    """(index, results dir) in a temp directory: the report and nightly tests' store."""
    from kdeval.storage import RunIndex

    idx = RunIndex.open(tmp_path / "index.sqlite")
    yield idx, tmp_path / "results"
    idx.close()
