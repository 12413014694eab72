"""The eviction core: policy interface, budgeted caches, the chunked engine, KeyDiff and its variants."""
from kdeval.keydiff import keydiff as _keydiff  # noqa: F401  (registers keydiff*, full)
from kdeval.keydiff.engine import Engine, EngineConfig
from kdeval.keydiff.state import GenerationResult, PrefillState, RunStats
from kdeval.keydiff.models import LoadedModel, UnsupportedModelError, load_model
from kdeval.keydiff.policy import Policy, ScoreContext
from kdeval.keydiff.registry import get_policy, list_policies, register

__all__ = [
    "Engine", "EngineConfig", "GenerationResult", "PrefillState", "RunStats", "LoadedModel",
    "UnsupportedModelError", "load_model", "Policy", "ScoreContext", "get_policy", "list_policies", "register",
]
