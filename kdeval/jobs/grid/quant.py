"""The ``kv_quant`` grid axis: how each cell stores its kept tokens (``kdeval.keydiff.quant.rule``).

A grid lists settings; every cell runs once per entry::

    kv_quant: [none, 8, {bits: 4}, {bits: 2, group_size: 32, window: 128, scheme: per_token}]

``none`` (or ``null``) stores tokens at the model's width; a number is ``{bits: n}``. The fields are the engine's
(``bits`` 2, 4 or 8; ``group_size`` numbers per scale and zero point; ``window`` recent tokens kept in full
precision; ``scheme`` ``kivi`` or ``per_token``), checked by its own rules, a wrong one reported at its path
(``kv_quant[1].bits: expected one of [2, 4, 8], got 3``). The axis is omitted from a cell's identity at ``none``,
so cells of grids without it keep their ids.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr
from typing_extensions import Annotated

from kdeval.cluster import catalog
from kdeval.jobs.grid.errors import GridIssue


class KVQuantSpec(BaseModel):
    """One quantized store (defaults: KIVI's 4 bits, groups of 32 or, for a model whose head_dim 32 does not
    divide, of the largest power of two that does, a window of 128 recent tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bits: StrictInt = Field(4, description="Bits per stored number: 2, 4 or 8.")
    group_size: StrictInt | None = Field(None, description="Numbers sharing one scale and zero point; a divisor of "
                                         "the model's head_dim. Unset: KIVI's 32, or for a model whose head_dim 32 "
                                         "does not divide, the largest power of two that does (16 for head_dim 16); "
                                         "the cell's label says which (`g16`).")
    window: StrictInt = Field(128, description="Most recent tokens kept in full precision.")
    scheme: StrictStr = Field("kivi", description="`kivi` (keys per channel, values per token) or `per_token` "
                              "(both per token).")

    @property
    def label(self) -> str:
        """``kivi-4b-g32-w128`` (the engine's label of the same setting; ``g?`` while the group is unset)."""
        return f"{self.scheme}-{self.bits}b-g{'?' if self.group_size is None else self.group_size}-w{self.window}"

    def for_head_dim(self, head_dim: int | None) -> "KVQuantSpec":
        """This setting with its group set: as given, else :func:`default_group` of ``head_dim``."""
        if self.group_size is not None:
            return self
        return self.model_copy(update={"group_size": default_group(head_dim)})


#: KIVI's group size, the default where the model's head_dim takes it.
KIVI_GROUP = 32


def default_group(head_dim: int | None) -> int:
    """The group of an unset ``group_size``: :data:`KIVI_GROUP` when it divides ``head_dim`` (or the head_dim is
    unknown), else the largest power of two dividing both (``gcd``: 16 for head_dim 16 or 80, 8 for 72)."""
    from math import gcd

    return KIVI_GROUP if not head_dim or head_dim % KIVI_GROUP == 0 else gcd(KIVI_GROUP, head_dim)


def _entry(value: Any) -> Any:
    """``none`` → None, a bare number of bits → ``{bits: n}``, anything else as it is."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    if type(value) is int:
        return {"bits": value}
    return value


KVQuantEntry = Annotated[KVQuantSpec | None, BeforeValidator(_entry)]


def kv_quant_issues(raw: dict) -> list[GridIssue]:
    """The engine's rules on every ``kv_quant`` entry's fields, each broken one at its path; entries of another
    shape are left to pydantic."""
    value = raw.get("kv_quant")
    if not isinstance(value, list):
        return [] if value is None else [GridIssue("kv_quant", "expected a list of settings (none, a number of "
                                                               f"bits, or a mapping of them), got {value!r}")]
    issues: list[GridIssue] = []
    seen: list[Any] = []
    for i, entry in enumerate(value):
        entry = _entry(entry)
        if isinstance(entry, dict):
            for name, v in entry.items():
                msg = catalog.kv_quant_field_error(name, v)
                if msg is not None:
                    issues.append(GridIssue(f"kv_quant[{i}].{name}", msg))
        normal = KVQuantSpec.model_construct(**entry).label if isinstance(entry, dict) else entry
        if normal in seen:
            issues.append(GridIssue(f"kv_quant[{i}]", "duplicate of an earlier entry (each setting once)"))
        seen.append(normal)
    return issues
