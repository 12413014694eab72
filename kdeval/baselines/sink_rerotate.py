"""StreamingLLM with key re-rotation (Xiao et al. 2023, as the paper's cache does it): ``sink``'s rule, and the
kept tokens always hold contiguous RoPE positions.

After every eviction the kept keys are re-rotated so that the ``n`` kept tokens sit at RoPE positions
``0 .. n-1`` (the sinks first, then the recent window in order), and new tokens are fed from position ``n``: the
model sees distances within the cache, never the true distance to the dropped middle, and never a position past
``budget + chunk``. The engine does it (``rerotates``, kdeval/keydiff/attention/rerotation.py); the kept set is ``sink``'s.

A policy of its own rather than a ``rerotate`` parameter of ``sink``: it changes what the model is fed, not which
tokens are kept, so it is compared with ``sink`` as another row, and ``sink`` stays kvpress' StreamingLLMPress
(which keeps positions; kvpress' ``KeyRerotationPress`` wrapper re-rotates).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kdeval.baselines.sink import Sink
from kdeval.keydiff.policy.interface import PolicyNeeds
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class SinkRerotate(Sink):
    name = "sink-rerotate"
    rule = ("StreamingLLM with re-rotation: keep the first n_sink tokens and the most recent ones, re-rotated to "
            "contiguous positions")

    def needs(self) -> PolicyNeeds:
        return replace(super().needs(), rerotates=True)
