"""The table of eviction policies by name, which every policy module registers into with :func:`register`.

This module only holds the table: the lookups that see every built-in policy (``get_policy``, ``policy_names``,
``describe``, ...) live in :mod:`kdeval.baselines.registry`, which imports every built-in policy module (KeyDiff's
variants here, the baselines there) before it reads the table, so nothing here imports upward.
"""
from __future__ import annotations

from typing import Any

from kdeval.keydiff.policy.interface import Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add ``cls`` under ``cls.name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy name '{cls.name}' is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove policy ``name`` from the table (a test's own policy, once the test is done); unknown names are
    ignored."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, type[Policy]]:
    """The policies registered so far, by name (a copy)."""
    return dict(_REGISTRY)


def as_policy(inner: Any) -> Policy | None:
    """A wrapper's inner policy: a policy object as it is, a registered name built at its defaults, else ``None``."""
    if isinstance(inner, Policy):
        return inner
    if isinstance(inner, str) and inner in _REGISTRY:
        return _REGISTRY[inner]()
    return None
