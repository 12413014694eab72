"""What workers can run: policy names/parameter checks and built-in model names.

The jobs layer validates grids through this module, so only the cluster layer imports the engine
(``kdeval.keydiff``) and the policies (``kdeval.baselines``). Both imports are lazy (they import torch),
so commands that never validate a grid do not pay for them.
"""
from __future__ import annotations

from typing import Any


def policy_names() -> list[str]:
    """Registered policy names."""
    from kdeval.baselines import policy_names as names

    return list(names())


def policy_param_error(name: str, params: dict[str, Any]) -> str | None:
    """The policy's own message for bad ``params`` (e.g. ``window: must be > 0``), or None when valid."""
    from kdeval.baselines import get_policy

    try:
        get_policy(name, **params)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def random_model_names() -> list[str]:
    """Names of the built-in tiny random models."""
    from kdeval.keydiff.models import random_model_names as names

    return list(names())
