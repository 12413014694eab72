"""Shared fixtures: the offline data directory; a temp index and results directory (``paths``, or ``store`` opened);
a local Ray kept from test to test (under pytest-xdist, the files that ask for it run on one worker); the service
commands as a Typer app; one torch thread in this process.

No Ray variable is set here: the product sets what it needs itself, kdeval subprocesses run without any
(``tests/user_env.py``), and the fixtures that build a Ray cluster in this process set its sandbox settings
(``sandbox_ray``)."""
from __future__ import annotations

import functools
import os
import sys
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


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One torch thread in this process (set before each test, in case one changed it). On two cores that other
    work keeps busy, every parallel region of two threads waits on the one not running: measured on a loaded
    machine, the hybrid-layer tests ran 25x and the two real-model e2e tests 5.6x slower with torch's default of
    two. Not an environment variable: kdeval subprocesses and Ray workers keep torch's default."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    """A fresh index file and results directory."""
    return {"db": tmp_path / "index.sqlite", "results": tmp_path / "results", "tmp": tmp_path}


_RAY_ADDRESS: list[str] = []  # the GCS address of the Ray local_ray started, while it runs
_ASKING: set[Path] = set()  # the test files where a test asks for local_ray


def pytest_collection_modifyitems(items):
    _ASKING.update(item.path for item in items if "local_ray" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="module")
def local_ray():
    """A local 2-CPU Ray, kept from one module that asks for it to the next (a Ray start costs seconds);
    started again when a test in between shut it down or joined another cluster. It is shut down before the
    tests of a module that does not ask for it (a CLI run in this process would join it) and at the end."""
    import ray

    if ray.is_initialized() and not _ours(ray):
        ray.shutdown()
    if not ray.is_initialized():
        sandbox_ray()
        info = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                        namespace="kdeval-tests", logging_level="WARNING")
        _RAY_ADDRESS[:] = [info.address_info["gcs_address"]]
    return ray


def _ours(ray) -> bool:
    """Whether this process is connected to the Ray local_ray started."""
    try:
        return ray.get_runtime_context().gcs_address in _RAY_ADDRESS
    except Exception:  # noqa: BLE001 - a half-shut Ray is not ours to keep
        return False


def _stop_local_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and _ours(ray):
        ray.shutdown()
    _RAY_ADDRESS.clear()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``make test``) with one change: the test files that ask for local_ray are one unit of
    work, run one after another on one worker, as in a serial run. local_ray then stays up from one such file to
    the next (each start costs seconds) instead of stopping whenever its worker turns to a file without it, and
    the two workers never both run a local_ray of 2 CPUs on a 2-core machine. The controller collects no tests:
    a file asks when its text names ``local_ray``."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LocalRayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return LOCAL_RAY_FILES if _names_local_ray(path) else path

    return LocalRayFilesTogether(config, log)


LOCAL_RAY_FILES = "the test files that ask for local_ray"


@functools.cache
def _names_local_ray(path: str) -> bool:
    file = REPO / path  # a node id's file, relative to the rootdir: this checkout
    return file.is_file() and "local_ray" in file.read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _no_local_ray_unasked(request):
    """The tests of a module where none asks for local_ray run without it (within a module that asks, the one
    Ray stays up from its first test to its last, as a module fixture does)."""
    if _RAY_ADDRESS and request.node.path not in _ASKING:
        _stop_local_ray()


@pytest.fixture(scope="session", autouse=True)
def _local_ray_ends_with_the_session():
    yield
    _stop_local_ray()


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
