"""The CLI's rich consoles, made per call: ``stdout(**options)`` and ``stderr(**options)``.

Why not one Console per module, made at import: a Console made while COLUMNS is set keeps that width for good, so
a module first imported under one width (a test's ``CliRunner().invoke(..., env={"COLUMNS": "80"})``, a long-lived
process) would print at that width to every later call. Made per call, a console follows the width of each call.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console


def stdout(**options: Any) -> Console:
    """A Console on stdout at this call's terminal width; ``options`` go to :class:`rich.console.Console`
    (e.g. ``markup=False`` where printed text comes from users)."""
    return Console(**options)


def stderr(**options: Any) -> Console:
    """A Console on stderr (``stderr=True``), made per call like :func:`stdout`."""
    return Console(stderr=True, **options)
