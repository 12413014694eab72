"""Baseline eviction policies, one small file each; importing this package registers every policy.

The registry in ``kdeval.keydiff`` imports this package on its first lookup, so ``kdeval.keydiff.get_policy``
and the names re-exported here see the same policies: KeyDiff's variants, ``full`` and the baselines.
A new baseline module is imported below.
"""
from kdeval.baselines import (  # noqa: F401  (registration)
    adakv, chunkkv, expected_attention, h2o, knorm, lagkv, pyramidkv, random_policy, sink, sink_rerotate, snapkv,
    tova,
)
from kdeval.keydiff.registry import UnknownPolicyError, describe, get_policy, list_policies, policy_names

__all__ = ["UnknownPolicyError", "describe", "get_policy", "list_policies", "policy_names"]
