"""The eviction core: policy interface, budgeted caches, the chunked engine, KeyDiff and its variants.

Rooms, bottom up: ``quant/``, ``attention/``, ``policy/``, ``cache/``, ``loop/``, ``plan/``, ``step/``, ``batch/``,
then ``engine.py`` (``config.py`` beside it); docs/engine.md maps them. Models are loaded by the zoo beside the
engine (``kdeval.zoo``), which the engine never imports.

Policies are looked up by name in ``kdeval.baselines`` (``get_policy``, ``policy_names``, ...), the layer above,
which imports every built-in policy; this package only holds the table they register into (``register``).

The names below are imported on first use: importing a light module of the package (``kdeval.keydiff.config``,
the policy interface) does not load the engine and transformers with it.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Engine": "engine", "EngineConfig": "config", "GenerationResult": "loop.state", "PrefillState": "loop.state",
    "RunStats": "loop.state", "Policy": "policy.interface", "ScoreContext": "policy.interface",
    "register": "policy.registry",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
