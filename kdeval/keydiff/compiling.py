"""``torch.compile`` for the engine's compiled parts (scoring, the cache-free blocks, FlexAttention).

Each compiled function is shared by every engine of the process, and its guards are on shapes and classes,
so a worker that runs a grid compiles it once per policy class x budget x chunk size x model: past dynamo's
default limit of 8 recompiles per function it would silently fall back to running uncompiled (for
FlexAttention, a reference implementation that materialises every score). :func:`compile_fn` raises that
limit once for the process.
"""
from __future__ import annotations

import torch

#: recompiles allowed per compiled function (dynamo's default is 8)
RECOMPILE_LIMIT = 64


def compile_fn(fn, **options):
    """``torch.compile(fn, **options)``, with the process's recompile limit raised to :data:`RECOMPILE_LIMIT`."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # renamed in torch 2.6
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
    return torch.compile(fn, **options)
