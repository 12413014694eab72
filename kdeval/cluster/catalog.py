"""What workers can run: policy names/parameter checks and built-in model names.

The jobs layer validates grids through this module, so only the cluster layer imports the engine
(``kdeval.keydiff``) and the policies (``kdeval.baselines``). Both imports are lazy and guarded: when a
package is missing, the documented names are used.
"""
from __future__ import annotations

import importlib
from typing import Any

#: Documented policy names (used only when ``kdeval.baselines`` cannot be imported).
FALLBACK_POLICIES = ("full", "keydiff", "sink", "tova", "h2o", "snapkv", "knorm", "random")
#: Documented tiny random models (used only when ``kdeval.keydiff.models`` cannot be imported).
FALLBACK_RANDOM_MODELS = ("random:llama-tiny", "random:qwen2-tiny")


def _try_import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def policy_names() -> list[str]:
    """Registered policy names."""
    mod = _try_import("kdeval.baselines")
    return list(mod.policy_names()) if mod is not None else list(FALLBACK_POLICIES)


def policy_param_error(name: str, params: dict[str, Any]) -> str | None:
    """The policy's own message for bad ``params`` (e.g. ``window: must be > 0``), or None when valid."""
    mod = _try_import("kdeval.baselines")
    if mod is None:
        return None
    try:
        mod.get_policy(name, **params)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def random_model_names() -> list[str]:
    """Names of the built-in tiny random models."""
    mod = _try_import("kdeval.keydiff.models")
    return list(mod.random_model_names()) if mod is not None else list(FALLBACK_RANDOM_MODELS)
