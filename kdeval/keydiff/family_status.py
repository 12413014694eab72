"""What the engine does with each family of the table (kdeval/keydiff/families.py), computed from its own checks.

A family's config is built as ``load_model("random:<key>-tiny")`` builds it (:func:`family_config`, no weights),
then its status is what :func:`~kdeval.keydiff.models.check_supported` and
:func:`~kdeval.keydiff.layer_kinds.layer_kinds` say of it: refused (and why), runs with its windowed layers kept
whole, or runs. Nothing here is written by hand, so the table cannot claim what the engine does not do; the
family tests (tests/keydiff/test_families.py) then prove every family that runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoConfig, PretrainedConfig

from kdeval.keydiff.byte_tokenizer import byte_level_tokenizer
from kdeval.keydiff.families import FAMILIES, Family
from kdeval.keydiff.layer_kinds import LayerKind, describe, layer_kinds
from kdeval.keydiff.models import UnsupportedModelError, check_supported
from kdeval.names import RANDOM_PREFIX

RUNS, REFUSED = "runs", "refused"


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
        """``"runs"``, ``"runs; windowed layers (sliding 48) kept whole"`` or ``"refused: <reason>"``."""
        if self.state == REFUSED:
            return f"refused: {self.detail}"
        return f"runs; {self.detail}" if self.detail else "runs"


def family_status(family: Family) -> FamilyStatus:
    """``family``'s status from the engine's checks (module docstring)."""
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
    windowed = [k for k in kinds if k.windowed]
    if getattr(config, "kv_lora_rank", None):  # the engine's plan checks the attention's expand_kv itself
        return FamilyStatus(family, RUNS, "latent (MLA) rows: a token's latent and rotary key evicted together; "
                                          "policies that read values or queries refused", kinds)
    if not windowed:
        return FamilyStatus(family, RUNS, "", kinds)
    spans = ", ".join(sorted({k.label() for k in windowed}))
    return FamilyStatus(family, RUNS, f"windowed layers ({spans}) kept whole", kinds)


def family_statuses() -> list[FamilyStatus]:
    """Every family of the table, in its order, with its status."""
    return [family_status(f) for f in FAMILIES]
