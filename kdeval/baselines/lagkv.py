"""LagKV (Liang et al. 2025, arXiv 2504.04704): score each partition's keys against the partition that follows.

Positions after the ``n_sink_tokens`` sinks are cut into partitions of ``lag_size``: partition ``p`` holds
``[n_sink + p * lag_size, n_sink + (p + 1) * lag_size)``. A token of partition ``p`` is scored by the
lag-relative spread of its key: per channel, min/max-normalised by the keys of the next partition that still
has cached tokens (``(k - min_ref) / (max_ref - min_ref)``), then the standard deviation over channels. Tokens
are ranked by it inside their partition, and the rank divided by the partition's cached count is the score, so
every scored partition loses the same share (kvpress' ``LagKVPress``, ``cross_scoring=False``).

The last complete partition and the incomplete one after it (the "tail", ``lag_size`` to ``2 * lag_size - 1``
positions) have no complete following partition yet: they rank above every scored token, newest first (so a
budget smaller than the tail keeps its newest tokens, as kvpress keeps the newest while fewer than
``n_sink + 2 * lag_size`` tokens are seen). In the chunked engine a partition is thus scored from the step at
which the partition after it is complete, against that partition's survivors; with one chunk covering the
prompt this is kvpress' rule.

Difference from the paper and kvpress: they average the key score and the same score computed on the values;
the policy interface gives policies the keys only, so this is the keys' half.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


def partition_runs(positions: torch.Tensor, n_sink: int, lag_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [rows, h, n]`` in position order → (run ``[rows, h, n]``: 0, 1, ... numbering the partitions
    that hold tokens, in order (the sinks form their own run); count ``[rows, h, n]``: tokens per run)."""
    part = torch.div(positions - n_sink, lag_size, rounding_mode="floor")  # sinks: negative
    starts = torch.ones_like(part, dtype=torch.bool)
    starts[..., 1:] = part[..., 1:] != part[..., :-1]
    run = starts.long().cumsum(-1) - 1
    count = torch.zeros_like(run).scatter_add_(-1, run, torch.ones_like(run))
    return run, count


def lag_spread(keys: torch.Tensor, run: torch.Tensor) -> torch.Tensor:
    """``keys [rows, h, n, d]`` in position order, ``run [rows, h, n]`` → ``[rows, h, n]``: the standard
    deviation over channels of each key min/max-normalised by the keys of the next run."""
    idx = run.unsqueeze(-1).expand_as(keys)
    lo = keys.new_zeros(keys.shape).scatter_reduce_(2, idx, keys, "amin", include_self=False)
    hi = keys.new_zeros(keys.shape).scatter_reduce_(2, idx, keys, "amax", include_self=False)
    ref = (idx + 1).clamp(max=keys.shape[2] - 1)  # the last run's reference does not matter (it is the tail)
    lo, hi = lo.gather(2, ref), hi.gather(2, ref)
    return ((keys - lo) / (hi - lo).clamp_min(1e-6)).std(dim=-1)  # a constant channel divides by 1e-6, not 0


def rank_in_run(values: torch.Tensor, run: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``values [rows, h, n]`` in position order → each token's rank inside its run (0 = lowest value, equal
    values older first) divided by the run's size: ``[rows, h, n]`` in [0, 1)."""
    by_value = torch.sort(values, dim=-1, stable=True).indices
    by_run = torch.sort(run.gather(-1, by_value), dim=-1, stable=True).indices
    perm = by_value.gather(-1, by_run)  # tokens ordered by (run, value, position)
    start = count.cumsum(-1) - count  # first place of each run in that order
    place = torch.arange(run.shape[-1], device=run.device).expand_as(run)
    rank = torch.empty_like(run).scatter_(-1, perm, place - start.gather(-1, run.gather(-1, perm)))
    return rank.to(values.dtype) / count.gather(-1, run).to(values.dtype)


@register
@dataclass
class LagKV(Policy):
    name = "lagkv"
    rule = ("rank each partition's keys by their spread against the next partition's min/max (keys only); "
            "the newest 1-2 partitions kept first")

    n_sink_tokens: int = 4
    lag_size: int = 128

    def needs(self) -> PolicyNeeds:
        """Ranks repeat from partition to partition: equal ranks are evicted oldest first."""
        return PolicyNeeds(exact_ties=True)

    def validate(self) -> None:
        if not isinstance(self.n_sink_tokens, int) or self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: must be an integer >= 0, got {self.n_sink_tokens!r}")
        if not isinstance(self.lag_size, int) or self.lag_size < 2:
            raise ValueError(f"lag_size: must be an integer >= 2, got {self.lag_size!r}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → ``[b, h, n]``: rank fractions in [0, 1) for scored tokens, 1 + position /
        (seen + 1) for the tail."""
        k = keys if keys.dtype == torch.float64 else keys.float()
        order = ctx.position_order()
        pos = ctx.positions.gather(-1, order)
        run, count = partition_runs(pos, self.n_sink_tokens, self.lag_size)
        spread = lag_spread(k.gather(2, order.unsqueeze(-1).expand_as(k)), run)
        scores = rank_in_run(spread, run, count)
        seen, s0, lag = ctx.seen, self.n_sink_tokens, self.lag_size
        tail_start = s0 + ((seen - s0) // lag) * lag - lag  # an int, or a tensor under graphs / ragged batches
        tail = 1.0 + pos.to(scores.dtype) / (seen + 1)
        scores = torch.where(pos >= tail_start, tail, scores)
        return torch.empty_like(scores).scatter_(-1, order, scores)
