"""Baseline eviction policies, one small file each, and the registry of every policy (:mod:`.registry`), whose
lookups see KeyDiff's variants, ``full`` and the baselines.
"""
from kdeval.baselines.registry import (
    PolicyInfo, UnknownPolicyError, describe, get_policy, list_policies, policy_class, policy_names,
)

__all__ = ["PolicyInfo", "UnknownPolicyError", "describe", "get_policy", "list_policies", "policy_class",
           "policy_names"]
