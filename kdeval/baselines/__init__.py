"""Baseline eviction policies; importing this package registers every policy (KeyDiff's too)."""
from kdeval.keydiff.registry import UnknownPolicyError, describe, get_policy, list_policies, policy_names

__all__ = ["UnknownPolicyError", "describe", "get_policy", "list_policies", "policy_names"]
