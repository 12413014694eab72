"""What a nightly runs on: the environment fingerprint and the salts that decide which cells a night recomputes.

A cell's id hashes what computes its result (code, data, settings), not the stack under it. A nightly therefore
salts its cells' storage ids (:attr:`kdeval.jobs.grid.cells.CellSpec.salt`), so yesterday's results are never reused
by mistake, and never overwritten either:

- ``reuse: never`` (the default): the salt is the night's own id, so every night computes its cells afresh;
  a resume of the same night runs the same run, whose cells keep that salt and are reused.
- ``reuse: unchanged``: the salt hashes the environment (:func:`night_environment`: kdeval version and source
  hash, torch, transformers, CUDA, the GPU driver, the device name) and the cell's dtype, so a cell is reused
  only from a night whose environment was the same.

The environment is read where ``kdeval nightly`` runs (import of torch and transformers included): run it on
a node of the kind the workers run on. Each cell also records its worker's provenance; the attribution
compares both.
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
from functools import lru_cache
from typing import Any, Callable

from kdeval import __version__
from kdeval.cluster.provenance import device_name
from kdeval.jobs.grid.cells import CellSpec
from kdeval.version import PACKAGE_ROOT, source_hash

#: The environment keys that decide reuse under ``reuse: unchanged`` (plus each cell's dtype).
ENV_KEYS = ("kdeval_version", "source_hash", "torch", "transformers", "cuda", "driver", "device")


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - a missing or broken library is recorded as absent
        return None
    return getattr(module, "__version__", None)


def _cuda_facts() -> tuple[str | None, str | None, str]:
    """(CUDA version of torch, GPU driver version, device name as cells record it); CPU-only: (None, None,
    "cpu <processor>")."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None, None, device_name(None)
    cuda = getattr(torch.version, "cuda", None)
    return cuda, _driver_version() if torch.cuda.is_available() else None, device_name(torch)


def _driver_version() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi`` (None when it is absent or does not answer)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def git_commit() -> str | None:
    """The git commit of the kdeval checkout (None when kdeval is not run from a git checkout: an installed
    package inside some other repository must not report that repository's commit)."""
    exe = shutil.which("git")
    if exe is None or not (PACKAGE_ROOT.parent / ".git").exists():  # a worktree's .git is a file
        return None
    try:
        out = subprocess.run([exe, "-C", str(PACKAGE_ROOT.parent), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@lru_cache(maxsize=1)
def _read_environment() -> dict[str, Any]:
    cuda, driver, device = _cuda_facts()
    return {"kdeval_version": __version__, "source_hash": source_hash(), "git_commit": git_commit(),
            "torch": _module_version("torch"), "transformers": _module_version("transformers"),
            "cuda": cuda, "driver": driver, "device": device, "python": platform.python_version()}


def night_environment() -> dict[str, Any]:
    """The stack this nightly runs on (JSON-able; keys :data:`ENV_KEYS`, ``git_commit`` and ``python``)."""
    return dict(_read_environment())


def environment_digest(env: dict[str, Any], dtype: str) -> str:
    """sha256 (16 hex digits) of the :data:`ENV_KEYS` of ``env`` and a cell's ``dtype``."""
    facts = {k: env.get(k) for k in ENV_KEYS} | {"dtype": dtype}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def cell_salt(reuse: str, night: str, env: dict[str, Any]) -> Callable[[CellSpec], str]:
    """Each cell's salt: ``night <night>`` (``reuse: never``) or ``env <digest>`` (``reuse: unchanged``)."""
    if reuse == "unchanged":
        return lambda cell: f"env {environment_digest(env, cell.model.dtype)}"
    return lambda cell: f"night {night}"
