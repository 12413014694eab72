"""The eviction core: policy interface, budgeted caches, the chunked engine, KeyDiff and its variants.

``get_policy`` / ``policy_names`` / ``list_policies`` / ``describe`` see every built-in policy, the baselines
included: the registry imports them on the first lookup (``registry.BUILTIN_POLICY_MODULES``), so importing
this package alone does not import ``kdeval.baselines``.
"""
from kdeval.keydiff import keydiff as _keydiff  # noqa: F401  (registers keydiff*, full)
from kdeval.keydiff.engine import Engine, EngineConfig
from kdeval.keydiff.state import GenerationResult, PrefillState, RunStats
from kdeval.keydiff.models import LoadedModel, UnsupportedModelError, load_model
from kdeval.keydiff.policy import Policy, ScoreContext
from kdeval.keydiff.registry import (
    PolicyInfo, UnknownPolicyError, describe, get_policy, list_policies, policy_names, register,
)

__all__ = [
    "Engine", "EngineConfig", "GenerationResult", "PrefillState", "RunStats", "LoadedModel",
    "UnsupportedModelError", "load_model", "Policy", "ScoreContext", "PolicyInfo", "UnknownPolicyError",
    "describe", "get_policy", "list_policies", "policy_names", "register",
]
