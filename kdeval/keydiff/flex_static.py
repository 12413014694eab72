"""FlexAttention for the static slot layout: one compiled kernel for every step kind, which skips the blocks of
keys its mask hides.

The static layout's mask (:func:`kdeval.keydiff.attention.static_mask`) shows every query the ``cached`` valid
head slots ``[0, cached)`` and its chunk's tail slots ``[N, N + t)`` causally. SDPA takes that mask as a dense
tensor and still reads and multiplies every key of the ``N + t``, so while the head fills (the first ``N / t``
chunks of a prompt) it does up to twice the work that the valid keys need. FlexAttention takes the same rule as a
``mask_mod`` plus a block mask of which ``128 x 128`` tiles have any visible key, and skips the empty tiles.
The block mask is built on the device from ``cached`` (a 0-d tensor under CUDA graphs), so one captured step
serves every fill level.

``torch.compile`` compiles the kernel once per shape (batch, ``t``, heads, slots, dtype; :mod:`kdeval.keydiff.compiling`); the engine uses this
only for the two shapes its graphs have (a full chunk and a decode step), never for a ragged last chunk.
"""
from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from kdeval.keydiff.cache import static_visible
from kdeval.keydiff.compiling import compile_fn



@functools.cache
def _flex():
    """``flex_attention`` through ``torch.compile`` (uncompiled it runs a slow reference implementation)."""
    return compile_fn(flex_attention, dynamic=False)


def static_block_mask(budget: int, t: int, cached: int | torch.Tensor, device: torch.device) -> BlockMask:
    """The static layout's mask for a chunk of ``t`` queries over ``budget + t`` slots, as a block mask.

    ``cached``: valid head slots (an int, or a 0-d device tensor: no host synchronisation)."""
    valid = torch.as_tensor(cached, device=device)

    def visible(b, h, q, kv):
        return static_visible(q, kv, valid, budget)

    return create_block_mask(visible, None, None, t, budget + t, device=device)


def flex_static_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                          block_mask: BlockMask) -> torch.Tensor:
    """``query [b, hq, t, d]`` over ``key``/``value [b, hk, N + t, d]`` under ``block_mask`` (from
    :func:`static_block_mask`) → ``[b, t, hq, d]``."""
    out = _flex()(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous()
