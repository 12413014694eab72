"""Rounding scores so that ties up to float noise become exact ties.

Some rules give a repeated token the same score at every position in exact arithmetic (CUR's norms, leverage of
the keys before RoPE at the first layer: the same key), but float rounding (RoPE's rotation and back, a forward
whose rounding depends on the batch's size) leaves them a few units in the last place apart, in an order that
differs between a batch row and the same request alone. Rounded to fewer significant bits they tie exactly, and
the engine keeps equal scores oldest first (``PolicyNeeds.exact_ties``).
"""
from __future__ import annotations

import torch

#: significant bits kept: float32 noise (2**-24 relative) is far below, real score gaps far above
SCORE_BITS = 16


def significant_bits(x: torch.Tensor, bits: int = SCORE_BITS) -> torch.Tensor:
    """``x`` rounded to ``bits`` significant binary digits (``torch.frexp``'s mantissa in ``[0.5, 1)``)."""
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2.0**bits) / 2.0**bits, exponent)
