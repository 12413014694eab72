"""KV quantization: the setting (:class:`KVQuant`), the quantize/dequantize rule, and the bytes it stores.

The rule is asymmetric min/max rounding over groups (KIVI's, jy-yuan/KIVI, and HQQ's and quanto's default
axis choice): for a group ``x`` of ``G`` numbers, ``zero = min(x)``, ``scale = (max(x) - min(x)) / (2^b - 1)``,
``code = clamp(round((x - zero) / scale), 0, 2^b - 1)`` and ``x' = code * scale + zero``. A group whose numbers are
all equal has ``scale = 0``: its codes are 0 and ``x' = zero``. ``scale`` and ``zero`` are stored at the cache's
own width (its dtype, e.g. float16) and the codes are computed from the stored ones, so ``x'`` is exactly what a
store holding ``(code, scale, zero)`` dequantizes to. Arithmetic runs in float32 (float64 for a float64 cache).

Schemes (which numbers form a group), for ``keys``/``values`` ``[rows, heads, tokens, head_dim]``:

- ``kivi``: keys **per channel**, each group the ``G`` consecutive positions ``[gG, (g+1)G)`` of one channel
  (KIVI: key outliers sit in fixed channels, so a channel's range is narrow); values **per token**, each group
  ``G`` consecutive channels of one token.
- ``per_token``: keys and values per token, groups of ``G`` channels (transformers' ``QuantizedCache``
  semantics, ``axis`` over the head dimension).

The ``window`` most recent positions are kept in full precision (KIVI's residual; transformers'
``residual_length``). Under ``kivi`` a key group is quantized once all of its ``G`` positions are older than the
window, so between ``window`` and ``window + G - 1`` tokens are in full precision (:meth:`KVQuant.frontier`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

#: What ``kdeval policies`` and the policy reference say about the axis.
EXPLANATION = (
    "Every policy composes with a quantized KV store (grid `kv_quant:`, a list of: none, a number of bits, or "
    "{bits, group_size, window, scheme}): the kept tokens older than the `window` most recent are stored in `bits` "
    "bits (2, 4 or 8) with a scale and a zero point per group of `group_size` numbers, under KIVI's scheme (`kivi`: "
    "keys per channel over groups of consecutive positions, values per token) or `per_token` (both per token, as "
    "transformers' QuantizedCache). A policy scores the step's incoming keys in full precision and the older kept "
    "keys as stored, dequantized: the keys attention reads. Tokens are quantized after eviction, so none is "
    "quantized only to be dropped. The quantized tokens are kept as a record of packed codes with their scales and "
    "zeros; peak_kv_bytes is that record's bytes plus the full-precision tokens' (the window, the incoming chunk).")

BITS = (2, 4, 8)
SCHEMES = ("kivi", "per_token")


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


#: Each field's test and what its message says when a value fails it (the grid reports them at its own paths).
RULES: dict[str, tuple[Any, str]] = {
    "bits": (lambda v: v in BITS and not isinstance(v, bool), f"expected one of {list(BITS)}"),
    "group_size": (lambda v: _count(v, 1), "expected a positive number of elements per group"),
    "window": (lambda v: _count(v, 0), "expected a number of recent tokens >= 0"),
    "scheme": (lambda v: v in SCHEMES, f"expected one of {list(SCHEMES)}"),
}


@dataclass(frozen=True)
class KVQuant:
    """How kept tokens are stored: ``bits`` per number, ``group_size`` G numbers per scale and zero point, the
    ``window`` most recent tokens in full precision, the ``scheme`` (module docstring)."""

    bits: int = 4
    group_size: int = 32
    window: int = 128
    scheme: str = "kivi"

    def __post_init__(self) -> None:
        for name, (allowed, expected) in RULES.items():
            value = getattr(self, name)
            if not allowed(value):
                raise ValueError(f"{name}: {expected}, got {value!r}")

    @classmethod
    def of(cls, value: "KVQuant | dict[str, Any]") -> "KVQuant":
        """A setting from itself or its fields (``{"bits": 4, ...}``); ``ValueError`` naming a wrong field."""
        if isinstance(value, KVQuant):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of {list(RULES)}, got {value!r}")
        unknown = sorted(set(value) - set(RULES))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; expected some of {list(RULES)}")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """``kivi-4b-g32-w128``: what reports and cell descriptions show."""
        return f"{self.scheme}-{self.bits}b-g{self.group_size}-w{self.window}"

    def check_head_dim(self, head_dim: int) -> None:
        """Groups of channels must tile the head dimension (``ValueError`` naming ``kv_quant.group_size``)."""
        if head_dim % self.group_size:
            raise ValueError(f"kv_quant.group_size: expected a divisor of the model's head_dim {head_dim}, "
                             f"got {self.group_size}")

    def frontier(self, seen: int | torch.Tensor) -> int | torch.Tensor:
        """Positions below this are stored quantized once ``seen`` tokens were fed (``seen`` an int or a tensor of
        rows): ``seen - window``, rounded down to a whole key group under ``kivi``; never below 0."""
        past = seen - self.window
        if isinstance(past, torch.Tensor):
            past = past.clamp(min=0)
        else:
            past = max(past, 0)
        if self.scheme == "kivi":
            past = (past // self.group_size) * self.group_size
        return past

    # ------------------------------------------------------------------ bytes

    def token_bytes(self, head_dim: int, itemsize: int) -> tuple[float, float]:
        """Bytes one quantized token stores per KV head: (its key's, its value's), payload plus the per-token
        groups' scales and zeros (a ``kivi`` key's per-channel scales are per group: :meth:`key_group_bytes`)."""
        payload = head_dim * self.bits / 8
        per_token = 2 * itemsize * head_dim // self.group_size
        return payload + (0 if self.scheme == "kivi" else per_token), payload + per_token

    def key_group_bytes(self, head_dim: int, itemsize: int) -> int:
        """Bytes of one ``kivi`` key group's scales and zeros per KV head: one pair per channel (0 otherwise)."""
        return 2 * itemsize * head_dim if self.scheme == "kivi" else 0


# ---------------------------------------------------------------------- the rule


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def scale_zero(lo: torch.Tensor, hi: torch.Tensor, bits: int, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's ``(scale, zero)`` from its min ``lo`` and max ``hi``, in ``dtype`` (the stored width)."""
    ct = compute_dtype(dtype)
    zero = lo.to(dtype)
    scale = ((hi.to(ct) - zero.to(ct)) / (2**bits - 1)).to(dtype)
    return scale, zero


def codes_of(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """The uint8 codes of ``x`` under the stored ``scale``/``zero`` (broadcast to ``x``)."""
    levels = 2**bits - 1
    ct = compute_dtype(x.dtype)
    s, z = scale.to(ct), zero.to(ct)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    codes = torch.where(s > 0, torch.round((x.to(ct) - z) / safe), torch.zeros_like(s)).clamp_(0, levels)
    return codes.to(torch.uint8)


def quantize(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes of ``x`` given its groups' ``lo``/``hi`` (min and max, broadcast to ``x``): ``(codes uint8, scale,
    zero)``, scale and zero in ``x.dtype`` (the stored width) and broadcast like ``lo``."""
    scale, zero = scale_zero(lo, hi, bits, x.dtype)
    return codes_of(x, scale, zero, bits), scale, zero


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``codes * scale + zero`` in float32 (float64), cast back to the scales' dtype."""
    ct = compute_dtype(scale.dtype)
    return (codes.to(ct) * scale.to(ct) + zero.to(ct)).to(scale.dtype)


def per_token_quantize(x: torch.Tensor, group: int, bits: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [..., d]`` quantized per token in groups of ``group`` channels: ``(codes [..., d] uint8, scale
    [..., d / group], zero [..., d / group])``; :func:`per_token_dequantize` inverts it."""
    g = x.unflatten(-1, (x.shape[-1] // group, group))
    codes, scale, zero = quantize(g, g.amin(-1, keepdim=True), g.amax(-1, keepdim=True), bits)
    return codes.flatten(-2), scale.squeeze(-1), zero.squeeze(-1)


def per_token_dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """What :func:`per_token_quantize`'s ``(codes, scale, zero)`` stand for, ``[..., d]``."""
    g = codes.unflatten(-1, (scale.shape[-1], codes.shape[-1] // scale.shape[-1]))
    return dequantize(g, scale.unsqueeze(-1), zero.unsqueeze(-1)).flatten(-2)


def per_token_roundtrip(x: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    """``x [..., d]`` quantized per token in groups of ``group`` channels and dequantized."""
    return per_token_dequantize(*per_token_quantize(x, group, bits))


def grouped_quantize(x: torch.Tensor, groups: torch.Tensor, bits: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [k, d]``, each row in group ``groups [k]`` (any integers): every (group, channel) quantized over the rows
    of its group (KIVI's keys: a group is a KV head's ``G`` consecutive positions). ``(codes [k, d] uint8, scale
    [n, d], zero [n, d], ids [n], inverse [k])``: one scale and zero per distinct group ``ids`` (sorted) and
    channel; row ``i`` dequantizes as ``dequantize(codes[i], scale[inverse[i]], zero[inverse[i]])``."""
    ct = compute_dtype(x.dtype)
    ids, inv = torch.unique(groups, return_inverse=True)
    n, d = ids.numel(), x.shape[-1]
    idx = inv.unsqueeze(-1).expand(-1, d)
    xs = x.to(ct)
    lo = torch.full((n, d), torch.finfo(ct).max, dtype=ct, device=x.device).scatter_reduce_(0, idx, xs, "amin")
    hi = torch.full((n, d), -torch.finfo(ct).max, dtype=ct, device=x.device).scatter_reduce_(0, idx, xs, "amax")
    scale, zero = scale_zero(lo, hi, bits, x.dtype)
    return codes_of(x, scale[inv], zero[inv], bits), scale, zero, ids, inv


def grouped_roundtrip(x: torch.Tensor, groups: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`grouped_quantize`'s rows dequantized, ``[k, d]``."""
    codes, scale, zero, _, inv = grouped_quantize(x, groups, bits)
    return dequantize(codes, scale[inv], zero[inv])


def per_channel_roundtrip(x: torch.Tensor, groups: torch.Tensor, chosen: torch.Tensor, n_groups: int,
                          bits: int) -> torch.Tensor:
    """``x [r, h, m, d]`` where ``chosen [r, h, m]``, quantized per channel over the slots that share a group
    (``groups [r, h, m]`` in ``[0, n_groups)``, apart per row and head), and dequantized; the other slots are
    returned as they are. A group's min and max run over its chosen slots only (the tokens a store holds when it
    quantizes them)."""
    r, h, _, _ = x.shape
    at = chosen.nonzero(as_tuple=True)
    flat = (at[0] * h + at[1]) * n_groups + groups[at]
    out = x.clone()
    out[at] = grouped_roundtrip(x[at], flat, bits)
    return out
