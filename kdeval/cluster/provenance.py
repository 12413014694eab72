"""Provenance of a cell's result: what computed it, recorded (not hashed into the cell id) by the worker.

Collected after the cell ran, on the worker. torch and transformers are looked up in ``sys.modules`` only
(never imported here), so a workload that did not need them (the stub) stays torch-free and records None.
"""
from __future__ import annotations

import platform
import socket
import sys
from typing import Any

from kdeval import __version__
from kdeval.cluster.workload import CellTask
from kdeval.version import source_hash


def device_name(torch: Any) -> str:
    """The CUDA device's name when CUDA is in use, else ``cpu <processor>`` (also what a nightly records as
    its own device, so the two compare)."""
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - a broken driver query must not fail a cell that already ran
        return "unknown"
    cpu = platform.processor() or platform.machine()
    return f"cpu {cpu}".strip()


def _version(module: Any) -> str | None:
    version = getattr(module, "__version__", None)
    return None if version is None else str(version)


def collect_provenance(task: CellTask, handle: Any = None) -> dict[str, Any]:
    """JSON-able facts about how ``task`` was computed here (keys below; None where not applicable).

    ``dtype`` is the one the model was loaded in (``handle.dtype``, e.g. ``bfloat16`` for a grid's ``auto`` on a
    GPU), else the grid's."""
    loaded = getattr(handle, "dtype", None)
    torch = sys.modules.get("torch")
    transformers = sys.modules.get("transformers")
    return {
        "kdeval_version": __version__,
        "source_hash": source_hash(),
        "torch": _version(torch),
        "transformers": _version(transformers),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),  # None: a CPU build (or no torch)
        "device": device_name(torch),
        "dtype": str(loaded).removeprefix("torch.") if loaded is not None else task.dtype,
        "attn_implementation": task.attn_implementation,
        "host": socket.gethostname(),
        "python": platform.python_version(),
    }
