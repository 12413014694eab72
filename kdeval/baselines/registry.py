"""Every eviction policy by name: KeyDiff's variants (kdeval/keydiff/policy/keydiff.py), ``full``
(kdeval/keydiff/policy/full.py) and the baselines.

Importing this module imports every built-in policy module, so the table they register into
(:mod:`kdeval.keydiff.policy.registry`) is complete before any lookup reads it. A new baseline module is imported below.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from kdeval.baselines import (  # noqa: F401  (registration)
    adakv, cam, chunkkv, compactor, criticalkv, cur, expected_attention, finch, h2o, knorm, kvzip, lagkv,
    leverage, merging, pyramidkv, random_policy, sink, sink_rerotate, snapkv, think, tova,
)
from kdeval.keydiff.policy import full, keydiff  # noqa: F401  (registers full, keydiff*)
from kdeval.keydiff.plan.plan import eager_reasons
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds
from kdeval.keydiff.policy.registry import registered
from kdeval.names import suggest


class UnknownPolicyError(ValueError):
    """An unknown policy name; the message suggests the closest registered names."""


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: str
    default: Any


@dataclass(frozen=True)
class PolicyInfo:
    """What ``kdeval policies`` prints for one policy: ``needs`` with its default parameters, and the extra
    cost they bring (:func:`extra_cost`)."""

    name: str
    rule: str
    params: tuple[ParamInfo, ...]
    needs: PolicyNeeds
    #: layers keep different budgets (``Policy.layer_budgets``, PyramidKV)
    per_layer_budgets: bool = False

    @property
    def cost(self) -> str:
        return extra_cost(self.needs, self.per_layer_budgets)

    def to_dict(self) -> dict[str, Any]:
        attention = self.needs.attention
        return {
            "name": self.name,
            "rule": self.rule,
            "params": [{"name": p.name, "type": p.type, "default": p.default} for p in self.params],
            "cost": self.cost,
            "per_layer_budgets": self.per_layer_budgets,
            "needs": {**dataclasses.asdict(self.needs),
                      "attention": None if attention is None else attention.rows_label()},
        }


def extra_cost(needs: PolicyNeeds, per_layer_budgets: bool = False) -> str:
    """What running a policy with ``needs`` costs beside scoring its keys, e.g. ``"attention rows of the last 32
    queries; per-token state: 1 float"``, or ``"none"``."""
    parts = []
    if needs.attention is not None:
        parts.append(f"attention rows of {needs.attention.rows_label()}")
    if needs.token_state:
        n = len(needs.token_state)
        parts.append(f"per-token state: {n} float{'s' if n > 1 else ''}")
    values = " and the values" if needs.values else ""
    if needs.queries is not None:
        parts.append(f"the last {needs.queries.window} queries before RoPE per layer{values}")
    elif needs.values:
        parts.append("the cached values")
    if needs.projections:
        parts.append("the layer's attention projections or RoPE applied to the cached tokens at every eviction")
    if needs.rerotates:
        parts.append("the kept keys re-rotated after every eviction")
    if needs.edits_kept_keys:
        parts.append("the kept keys edited after every eviction")
    if needs.shares_heads:
        parts.append("KV heads x the attention compute (one slot pool per layer, same memory)")
    if needs.merges:
        parts.append("the freed tokens' key cosines to every cached token and a value merge at every eviction "
                     "(same memory)")
    if needs.repeat is not None:
        parts.append("one extra forward over the repeat prompt and the context (2-3x a prefill)")
    eager = eager_reasons(needs, per_layer_budgets)
    if eager:
        parts.append(f"no CUDA graphs ({', '.join(eager)})")
    return "; ".join(parts) or "none"


def policy_names() -> list[str]:
    """Every registered policy name, the built-in ones included, sorted."""
    return sorted(registered())


def policy_class(name: str) -> type[Policy]:
    table = registered()
    if name not in table:
        raise UnknownPolicyError(f"policy: unknown name '{name}'{suggest(name, policy_names())} (known: {', '.join(policy_names())})")
    return table[name]


def _coerce(value: Any, annotation: Any, field_name: str, policy: str) -> Any:
    """Turn CLI strings (``key=value``) into the field's type; leave other values alone."""
    if not isinstance(value, str):
        return value
    target = annotation if isinstance(annotation, type) else None
    if annotation in ("int", int) or target is int:
        caster: Any = int
    elif annotation in ("float", float) or target is float:
        caster = float
    elif annotation in ("bool", bool) or target is bool:
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"{field_name}: policy '{policy}' expects true/false, got {value!r}")
    else:
        return value
    try:
        return caster(value)
    except ValueError:
        raise ValueError(f"{field_name}: policy '{policy}' expects {caster.__name__}, got {value!r}") from None


def _inner_policy(value: Any, field_name: str) -> Any:
    """A wrapped policy given as ``{name, params}`` (a grid's nested mapping) → the policy object; a name or a
    policy object is left to the wrapper. Its own bad parameters get a message naming ``<field>.params.<key>``."""
    if not isinstance(value, dict):
        return value
    name, params = value.get("name"), value.get("params", {})
    if set(value) - {"name", "params"} or not isinstance(name, str) or not isinstance(params, dict):
        raise ValueError(f"{field_name}: expected a policy name or {{name: <policy>, params: {{...}}}}, got {value!r}")
    if name not in registered():
        return name  # the wrapper names what it can wrap
    try:
        return get_policy(name, **params)
    except ValueError as e:
        head, sep, rest = str(e).partition(": ")
        if sep and head.split(".")[0] in params:
            raise ValueError(f"{field_name}.params.{head}: {rest}") from None
        raise ValueError(f"{field_name}: {e}") from None


def get_policy(name: str, **params: Any) -> Policy:
    """Build policy ``name`` with ``params``; unknown names and parameters get a clear ``ValueError``. A wrapper's
    ``inner`` policy is a name, a policy object or ``{name, params}``."""
    cls = policy_class(name)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in params:
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ValueError(f"{key}: unknown parameter for policy '{name}'{suggest(key, list(fields))} (parameters: {known})")
    coerced = {k: _inner_policy(v, k) if k == "inner" else _coerce(v, hints.get(k), k, name)
               for k, v in params.items()}
    return cls(**coerced)


def describe(name: str) -> PolicyInfo:
    cls = policy_class(name)
    hints = typing.get_type_hints(cls)
    params = tuple(
        ParamInfo(f.name, getattr(hints.get(f.name), "__name__", str(hints.get(f.name))), f.default)
        for f in dataclasses.fields(cls)
    )
    policy = cls()
    per_layer = len(set(policy.layer_budgets(1024, 32))) > 1  # a budget and depth every default fits
    return PolicyInfo(cls.name, cls.rule, params, policy.needs(), per_layer)


def list_policies() -> list[PolicyInfo]:
    return [describe(n) for n in policy_names()]
