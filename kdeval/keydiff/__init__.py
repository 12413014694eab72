"""The eviction core: policy interface, budgeted caches, the chunked engine, KeyDiff and its variants.

Policies are looked up by name in ``kdeval.baselines`` (``get_policy``, ``policy_names``, ...), the layer above,
which imports every built-in policy; this package only holds the table they register into (``register``).
"""
from kdeval.keydiff.engine import Engine, EngineConfig
from kdeval.keydiff.models import LoadedModel, UnsupportedModelError, load_model
from kdeval.keydiff.policy import Policy, ScoreContext
from kdeval.keydiff.registry import register
from kdeval.keydiff.state import GenerationResult, PrefillState, RunStats

__all__ = [
    "Engine", "EngineConfig", "GenerationResult", "PrefillState", "RunStats", "LoadedModel",
    "UnsupportedModelError", "load_model", "Policy", "ScoreContext", "register",
]
