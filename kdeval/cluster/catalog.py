"""What workers can run: policy names/parameter checks and built-in model names.

The jobs layer validates grids and hashes policy code through this module instead of importing the engine
(``kdeval.keydiff``) and the policies (``kdeval.baselines``) itself. Both imports are lazy (they import torch),
so commands that never validate a grid do not pay for them.
"""
from __future__ import annotations

from functools import lru_cache
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


def policy_budget_error(name: str, params: dict[str, Any], budget: int) -> str | None:
    """The policy's own message when ``budget`` cannot hold the tokens it always keeps, else None (also for an
    unknown policy or bad parameters, which :func:`policy_param_error` reports)."""
    from kdeval.baselines import get_policy

    try:
        policy = get_policy(name, **params)
    except (TypeError, ValueError):
        return None
    try:
        policy.check_budget(budget)
    except ValueError as e:
        return str(e)
    return None


def _evicting_policy(name: str, params: dict[str, Any]) -> Any:
    """Policy ``name`` built with ``params`` when it evicts, else None (also for an unknown policy or bad
    parameters, which :func:`policy_param_error` reports)."""
    from kdeval.baselines import get_policy

    try:
        policy = get_policy(name, **params)
    except (TypeError, ValueError):
        return None
    return policy if policy.evicts else None


def policy_attention_error(name: str, params: dict[str, Any], attn_implementation: str) -> str | None:
    """Why policy ``name`` cannot run on a model loaded with ``attn_implementation`` (it needs the engine's
    SDPA-based attention: attention rows, per-layer budgets, a head-shared pool), else None (also for an
    unknown policy or bad parameters, which :func:`policy_param_error` reports)."""
    from kdeval.keydiff.plan.plan import SDPA_FAMILY, own_attention_reason

    policy = None if attn_implementation in SDPA_FAMILY else _evicting_policy(name, params)
    if policy is None:
        return None
    return own_attention_reason(policy.needs(), len(set(policy.layer_budgets(1024, 32))) > 1)


def policy_model_error(name: str, params: dict[str, Any], shape: Any) -> str | None:
    """Why policy ``name`` cannot run on a model of ``shape`` (:func:`model_shape`): beside windowed layers, or on an
    MLA cache, in the engine's own words (``kdeval.keydiff.plan.plan``), else None (as :func:`policy_attention_error`)."""
    from kdeval.keydiff.plan.refusals import latent_refusal, recurrent_refusal, windowed_refusal

    policy = _evicting_policy(name, params) if shape.windowed or shape.latent else None
    if policy is None:
        return None
    needs = policy.needs()
    return ((windowed_refusal(needs) if shape.windowed else None) or (latent_refusal(needs) if shape.latent else None)
            or (recurrent_refusal(needs) if shape.recurrent else None))


def policy_protocol_error(name: str, params: dict[str, Any], compress: str) -> str | None:
    """Why policy ``name`` cannot run under ``protocol.compress`` (``generated``: it has no score for a
    generated token, :func:`kdeval.evals.task_run.settings.generated_refusal`), else None (as
    :func:`policy_attention_error`)."""
    from kdeval.evals.task_run.settings import generated_refusal

    policy = _evicting_policy(name, params) if compress == "generated" else None
    return generated_refusal(policy.needs()) if policy is not None else None


def policy_keeps_budget_per_head(name: str, params: dict[str, Any]) -> bool:
    """Whether policy ``name`` evicts to exactly N tokens in every layer and KV head (no per-layer budgets, no
    head-shared pool): what a setting is checked against when it depends on N (False for an unknown policy or
    bad parameters, which :func:`policy_param_error` reports)."""
    policy = _evicting_policy(name, params)
    if policy is None:
        return False
    return len(set(policy.layer_budgets(1024, 32))) == 1 and not policy.needs().shares_heads


def kv_quant_frontier(fields: dict[str, Any], seen: int) -> int:
    """The positions below which a store of ``fields`` (``bits``, ``group_size``, ``window``, ``scheme``)
    holds tokens quantized once ``seen`` tokens were fed (``kdeval.keydiff.quant.rule.KVQuant.frontier``)."""
    from kdeval.keydiff.quant.rule import KVQuant

    return int(KVQuant.of(fields).frontier(seen))


def engine_setting_error(name: str, value: Any) -> str | None:
    """The engine's own message when ``value`` breaks its rule for setting ``name`` (``chunk_size``: "must be a
    positive number of tokens, got 0", without the name), else None (``kdeval.keydiff.config.RULES``)."""
    from kdeval.keydiff.config import setting_error

    return setting_error(name, value)


def kv_quant_field_error(name: str, value: Any) -> str | None:
    """The engine's message when ``value`` breaks its rule for ``kv_quant`` field ``name`` (``bits``: "expected
    one of [2, 4, 8], got 3"), else None; None too for a name it does not know (the grid's schema reports it)
    and a value of the wrong type (idem) (``kdeval.keydiff.quant.rule.RULES``)."""
    from kdeval.keydiff.quant.rule import RULES, KVQuant

    if name not in RULES or type(value) is not type(getattr(KVQuant(), name)):
        return None
    allowed, expected = RULES[name]
    return None if allowed(value) else f"{expected}, got {value!r}"


def policy_source_files(name: str, params: dict[str, Any] | None = None) -> list[str]:
    """Package-relative source files of policy ``name``'s class and its bases (the policy interface module
    excepted: it is engine code), e.g. ``["baselines/snapkv.py"]``, and those of the policy it wraps when it
    takes an ``inner`` policy (ChunkKV, AdaKV: its ``params["inner"]``, a name or ``{name, params}``, or the
    default)."""
    import inspect
    from pathlib import Path

    from kdeval.baselines import policy_class
    from kdeval.keydiff.policy import interface
    from kdeval.version import PACKAGE_ROOT

    files = []
    for cls in policy_class(name).__mro__:
        module = inspect.getmodule(cls)
        if module is None or module is interface or not module.__name__.startswith("kdeval."):
            continue
        files.append(Path(inspect.getsourcefile(cls)).resolve().relative_to(PACKAGE_ROOT).as_posix())
    field = getattr(policy_class(name), "__dataclass_fields__", {}).get("inner")
    if field is not None:
        inner, inner_params = (params or {}).get("inner", field.default), {}
        if isinstance(inner, dict):  # a nested policy: {name, params}
            inner, inner_params = inner.get("name"), inner.get("params") or {}
        if isinstance(inner, str) and inner != name and inner in policy_names():
            files += policy_source_files(inner, inner_params)
    return sorted(set(files))


def wrapped_policy_names(name: str, params: dict[str, Any] | None = None) -> list[str]:
    """Policy ``name`` and the one it wraps (``params["inner"]``, a name or ``{name, params}``, or the
    default), recursively: every policy whose code computes its cells."""
    names = [name]
    field = getattr(_policy_class(name), "__dataclass_fields__", {}).get("inner") if name in policy_names() else None
    if field is not None:
        inner, inner_params = (params or {}).get("inner", field.default), {}
        if isinstance(inner, dict):
            inner, inner_params = inner.get("name"), inner.get("params") or {}
        if isinstance(inner, str) and inner != name and inner in policy_names():
            names += wrapped_policy_names(inner, inner_params)
    return names


def _policy_class(name: str) -> Any:
    from kdeval.baselines import policy_class

    return policy_class(name)


def policy_plugin_digest(name: str, params: dict[str, Any] | None = None) -> str:
    """The digest of the plugin code of policy ``name`` and the policy it wraps (their source and version,
    :mod:`kdeval.cluster.plugins`); "" for built-in policies, whose code :mod:`kdeval.version` hashes."""
    from kdeval.cluster.plugins import policy_plugin_digest as digest

    return digest(wrapped_policy_names(name, params))


@lru_cache(maxsize=1)
def every_policy_source_file() -> tuple[str, ...]:
    """:func:`policy_source_files` of every registered policy."""
    return tuple(sorted({f for name in policy_names() for f in policy_source_files(name)}))


def random_model_names() -> list[str]:
    """Names of the built-in tiny random models."""
    from kdeval.zoo.random_models import random_model_names as names

    return list(names())


def model_shape(model_id: str, revision: str | None = None) -> Any:
    """The model's shape without its weights (``head_dim``, ``context``; :mod:`kdeval.zoo.model_config`), or
    None when it cannot be known offline or its config is refused (which :func:`model_id_problem` says)."""
    from kdeval.zoo.config_check import ModelConfigError
    from kdeval.zoo.model_config import model_shape as shape

    try:
        return shape(model_id, revision)
    except ModelConfigError:
        return None


def model_id_problem(model_id: str, revision: str | None = None) -> str | None:
    """Why ``model_id`` names no model that can be loaded (a path without config.json, a hostile config,
    tokenizer file or truncated weights, custom code, a URL, a malformed hub id), else None
    (:func:`kdeval.zoo.model_config.model_id_problem`)."""
    from kdeval.zoo.model_config import model_id_problem as problem

    return problem(model_id, revision)


def model_tokenizer(model_id: str, revision: str | None = None) -> Any:
    """The model's tokenizer when it can be had offline, else None (imports transformers;
    :func:`kdeval.zoo.model_config.model_tokenizer`)."""
    from kdeval.zoo.model_config import model_tokenizer as tokenizer

    return tokenizer(model_id, revision)


def warn_char_level(tokenizer: Any, model_id: str) -> None:
    """One line on stderr when ``model_id``'s tokenizer looks character-level
    (:func:`kdeval.zoo.tokenizer_check.warn_char_level`)."""
    from kdeval.zoo.tokenizer_check import warn_char_level as warn

    warn(tokenizer, model_id)
