"""What the engine does with each family of the table (kdeval/zoo/families.py), computed from its own checks.

A family's config is built as ``load_model("random:<key>-tiny")`` builds it (:func:`family_config`, no weights),
then its status is what :func:`~kdeval.zoo.loading.check_supported` and
:func:`~kdeval.keydiff.attention.layer_kinds.layer_kinds` say of it: refused (and why), runs with its windowed layers kept
whole, or runs. A family that runs is then built (tiny, random, a fraction of a second) and every policy it is given
goes through the engine's plan (:func:`~kdeval.keydiff.plan.plan.make_plan`, the code that refuses a policy when an
engine is built): the ones it refuses are listed with the plan's one-line reasons. Nothing here is written by hand,
so the table cannot claim what the engine does not do; the family tests (tests/keydiff/test_families.py) then prove
every family that runs.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from transformers import AutoConfig, PretrainedConfig

from kdeval.zoo.byte_tokenizer import byte_level_tokenizer
from kdeval.zoo.families import FAMILIES, Family
from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.attention.layer_kinds import LayerKind, describe, layer_kinds
from kdeval.zoo.loading import UnsupportedModelError, check_supported, load_model
from kdeval.keydiff.plan.plan import make_plan
from kdeval.keydiff.policy.interface import Policy
from kdeval.names import RANDOM_PREFIX

RUNS, REFUSED = "runs", "refused"
#: the engine settings each policy's plan is made under: the family tests' budget and chunk
PROBE_CONFIG = EngineConfig(budget=32, chunk_size=16)


def family_config(family: Family) -> PretrainedConfig:
    """``family``'s tiny config as ``load_model`` builds it for ``random:<key>-tiny``: the byte-level tokenizer's
    vocabulary and special tokens, tied embeddings."""
    tokenizer = byte_level_tokenizer()
    params = family.kwargs()
    model_type = params.pop("model_type")
    return AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, **params,
    )


@dataclass(frozen=True)
class FamilyStatus:
    """A family's row: its layers' kinds (``None`` when a layer is of a type the engine does not run) and what the
    engine does with it."""

    family: Family
    state: str  # RUNS or REFUSED
    detail: str  # the refusal's reason, or the windowed layers in words ("" when every layer is full)
    kinds: tuple[LayerKind, ...] | None
    #: (policy, the plan's one-line refusal) for every policy the engine refuses on this family, by name
    refused: tuple[tuple[str, str], ...] = ()
    #: ``detail`` in two or three words for a narrow table ("windows kept whole", "latent rows"; "" when none)
    brief: str = ""

    @property
    def runs(self) -> bool:
        return self.state == RUNS

    @property
    def layers(self) -> str:
        """``"3 layers: 1 full, 2 sliding 48"``, or the layer count alone when the kinds were not read."""
        if self.kinds is None:
            return f"{self.family.kwargs()['num_hidden_layers']} layers"
        return describe(self.kinds)

    def text(self) -> str:
        """``"runs"``, ``"runs; windowed layers (sliding 48) kept whole"``, ``"refused: <reason>"``, and after a
        family that runs, each group of refused policies with their shared cause (:func:`refusal_cause`):
        ``"runs; snapkv, tova refused: <cause>"``."""
        if self.state == REFUSED:
            return f"refused: {self.detail}"
        parts = ["runs"] + [self.detail] * bool(self.detail)
        parts += [f"{', '.join(names)} refused: {cause}" for cause, names in self.refusal_groups()]
        return "; ".join(parts)

    def refusal_groups(self) -> list[tuple[str, list[str]]]:
        """The refused policies grouped by :func:`refusal_cause`, in order of each cause's first policy."""
        groups: dict[str, list[str]] = {}
        for name, message in self.refused:
            groups.setdefault(refusal_cause(name, message), []).append(name)
        return list(groups.items())


def refusal_reason(name: str, message: str) -> str:
    """The plan's refusal ``message`` for policy ``name`` without its field prefix (``"policy: 'snapkv' "``,
    ``"model: "``)."""
    return re.sub(rf"^(policy: '{re.escape(name)}' |\w+: )", "", message)


def refusal_cause(name: str, message: str) -> str:
    """What of the model makes the plan refuse ``name``, shared by the policies refused for it: a policy's refusal
    reads ``"policy: '<name>' <what it needs>; <why this model lacks it>"`` (or ``"..., which <this model's cache does
    not hold>"``); the part after the policy's own need, else the whole :func:`refusal_reason`."""
    reason = refusal_reason(name, message)
    if not message.startswith("policy: "):
        return reason
    if "; " in reason:
        return reason.rsplit("; ", 1)[1]
    head, which, tail = reason.partition(", which ")
    return f"they need what {tail}" if which else reason


def policy_refusals(model, policies: Mapping[str, Policy]) -> tuple[tuple[str, str], ...]:
    """(name, one-line refusal) for each of ``policies`` whose engine plan on ``model`` raises ``ValueError``
    (under :data:`PROBE_CONFIG`), in ``policies``' order."""
    out = []
    for name, policy in policies.items():
        try:
            make_plan(model, policy, PROBE_CONFIG)
        except ValueError as e:
            out.append((name, str(e)))
    return tuple(out)


def family_status(family: Family, policies: Mapping[str, Policy]) -> FamilyStatus:
    """``family``'s status from the engine's checks (module docstring), with the ones of ``policies`` (name ->
    policy) its engine refuses."""
    config = family_config(family)
    try:
        kinds: tuple[LayerKind, ...] | None = layer_kinds(config)
    except ValueError as e:  # a layer type the engine does not run
        kinds, unread = None, str(e)
    try:
        check_supported(config, RANDOM_PREFIX + family.random_kind)
    except UnsupportedModelError as e:
        return FamilyStatus(family, REFUSED, str(e).removeprefix(f"{RANDOM_PREFIX}{family.random_kind}: "), kinds)
    if kinds is None:
        return FamilyStatus(family, REFUSED, unread, None)
    model = load_model(RANDOM_PREFIX + family.random_kind, device="cpu").model
    refused = policy_refusals(model, policies)
    windowed = [k for k in kinds if k.windowed and k.attends]
    parts, briefs = [], []
    shared = [(i, k.reads_layer) for i, k in enumerate(kinds) if k.reads_layer is not None]
    if shared:
        pairs = ", ".join(f"{i} reads {j}" for i, j in shared)
        parts.append(f"KV-shared layers ({pairs}) see their source's kept set")
        briefs.append("shared KV")
    if any(k.holds_state for k in kinds):
        parts.append("recurrent layers' states kept whole, apart from N; a batch runs one request at a time "
                     "(padding would enter the states)")
        briefs.append("states kept")
    if getattr(config, "kv_lora_rank", None):  # the engine's plan checks the attention's expand_kv itself
        parts.append("latent (MLA) rows: a token's latent and rotary key evicted together")
        briefs.append("latent rows")
    if windowed:
        spans = ", ".join(sorted({f"{k.kind} {k.span}" for k in windowed}))
        parts.append(f"windowed layers ({spans}) kept whole")
        briefs.append("windows kept whole")
    return FamilyStatus(family, RUNS, "; ".join(parts), kinds, refused, brief=", ".join(briefs))


def family_statuses(policies: Mapping[str, Policy]) -> list[FamilyStatus]:
    """Every family of the table, in its order, with its status and the ones of ``policies`` it refuses."""
    return [family_status(f, policies) for f in FAMILIES]
