"""Baseline eviction policies, one small file each; importing this package registers every policy.

``get_policy`` here sees KeyDiff's variants, ``full`` and the baselines: callers that need every policy
import it from ``kdeval.baselines``.
"""
from kdeval.baselines import h2o, knorm, random_policy, sink, snapkv, tova  # noqa: F401  (registration)
from kdeval.keydiff.registry import UnknownPolicyError, describe, get_policy, list_policies, policy_names

__all__ = ["UnknownPolicyError", "describe", "get_policy", "list_policies", "policy_names"]
