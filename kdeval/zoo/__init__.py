"""The model zoo, beside the engine: loading models by name (hub ids, local paths, the offline GGUF packages,
tiny random configs), a model's shape read without weights, and the family table. The engine imports none of it.

The names below are imported on first use, so that importing a light module of the package does not load
transformers with it.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"LoadedModel": "loading", "UnsupportedModelError": "loading", "load_model": "loading"}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
