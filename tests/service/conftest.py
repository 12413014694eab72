"""Fixtures of the service tests: temp index + results dirs, a local Ray, stub grids, the CLI app."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.user_env import sandbox_ray

STUB_GRID = """
name: stub-grid
models: ["stub:{cost}"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 3}}]
resources: {{workers: {workers}}}
retries: {{max_attempts: 3}}
"""


def stub_grid(cost: float = 0.02, workers: int = 2) -> str:
    """A 5-cell grid (full shared across 2 budgets + 2 policies x 2 budgets) of stub cells."""
    return STUB_GRID.format(cost=cost, workers=workers)


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
