"""ExpectedAttention (kvpress' ``ExpectedAttentionPress``, Devoto et al. 2025): keep the keys future queries are
expected to attend to, from the statistics of recent queries and the RoPE rotation ahead; no attention matrix.

The rule, per layer:

1. Statistics window: the layer's recent queries *before RoPE*: the last ``query_window`` queries the request
   has fed (prompt chunks and decode steps alike, kept across steps by the engine, kdeval/keydiff/attention/queries.py),
   leaving out those at positions ``< n_sink_tokens`` (outliers). Their mean ``mu`` and (biased) covariance
   ``cov`` per query head. With one chunk covering the prompt and ``query_window >=`` its length, that is the
   prompt's queries after the sinks: kvpress' window. Chunked, a running window of the last 512 queries (the
   default) keeps the statistics from the same recent stretch of text whatever the chunk size, and gives a
   decode step (one query) statistics of more than one query.
2. Look-ahead: the next ``n_future_positions`` positions after the step, ``seen .. seen + n_future - 1`` (as
   kvpress: the positions right after the prompt). The mean of RoPE's rotation over them, ``R``
   (:func:`mean_rotation`), turns the statistics into those of a future query: ``mu' = R mu``,
   ``cov' = R cov R^T``.
3. A query ``q ~ N(mu', cov')`` gives ``E[exp(q . k / sqrt(d))] = exp(mu' . k / sqrt(d) + k^T cov' k / (2 d))``
   (kvpress' scaling of the variance term); the softmax of these logits over the cached keys other than the
   sinks, averaged over the query heads of each KV head, times ``|v|`` (``use_vnorm``, after adding
   ``epsilon``) is the score. Sinks are protected by the engine.

The engine passes the window, RoPE's ``cos``/``sin`` ahead and the values through ``ScoreContext.queries`` and
``ScoreContext.values`` because :meth:`ExpectedAttention.needs` asks for them; a query window runs on the
eager path. :meth:`ExpectedAttention.score_from` computes the same scores from queries given directly (one
chunk; the tests check the engine against it); ``bench/kvpress_parity.py`` checks the policy against kvpress on
the real model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.attention.queries import QueryNeed
from kdeval.keydiff.policy.registry import register


def query_statistics(queries: torch.Tensor, skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``queries [b, hq, t, d]`` (before RoPE) → mean ``[b, hq, d]`` and biased covariance ``[b, hq, d, d]``
    of the queries after the first ``skip``."""
    q = queries[:, :, skip:].to(torch.promote_types(queries.dtype, torch.float32))
    mean = q.mean(dim=2)
    centred = q - mean.unsqueeze(2)
    return mean, centred.transpose(-1, -2) @ centred / q.shape[2]


def window_statistics(queries: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``queries [b, hq, w, d]`` (before RoPE) and ``valid [b, w]`` → mean ``[b, hq, d]`` and biased covariance
    ``[b, hq, d, d]`` of each row's valid queries (zeros for a row with none)."""
    q = queries.to(torch.promote_types(queries.dtype, torch.float32))
    mask = valid.to(q.dtype).view(valid.shape[0], 1, -1, 1)
    n = valid.sum(-1).clamp(min=1).to(q.dtype).view(-1, 1, 1)
    mean = (q * mask).sum(dim=2) / n
    centred = (q - mean.unsqueeze(2)) * mask
    return mean, centred.transpose(-1, -2) @ centred / n.unsqueeze(-1)


def mean_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation averaged over positions: ``cos``/``sin [..., positions, d]`` (the model's rotary embedding,
    halves duplicated as transformers lays them out) → ``[..., d, d]``, the mean of ``diag(cos) + diag(sin) P``
    with ``P x = rotate_half(x) = (-x2, x1)`` (a linear map: the rotation of the mean cos and sin)."""
    d = cos.shape[-1]
    half = torch.eye(d // 2, dtype=cos.dtype, device=cos.device)
    p = torch.zeros(d, d, dtype=cos.dtype, device=cos.device)
    p[: d // 2, d // 2 :], p[d // 2 :, : d // 2] = -half, half
    return torch.diag_embed(cos.mean(-2)) + sin.mean(-2).unsqueeze(-1) * p


def expected_attention_scores(keys: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor | None,
                              values: torch.Tensor | None = None, scored: torch.Tensor | None = None,
                              epsilon: float = 0.0) -> torch.Tensor:
    """``keys [b, hk, n, d]`` (after RoPE), a future query's ``mean [b, hq, d]`` and ``cov [b, hq, d, d]``
    (``None``: mean only) → ``[b, hk, n]``: softmax over the ``scored [b, hk, n]`` keys (default all) of
    ``mean . k / sqrt(d) + k^T cov k / (2 d)``, averaged over each KV head's query heads, times ``|v|`` when
    ``values [b, hk, n, d_v]`` are given (``epsilon`` added first). Unscored keys get 0 before the ``|v|``."""
    b, hk, n, d = keys.shape
    group = mean.shape[1] // hk
    k = keys.to(mean.dtype).repeat_interleave(group, dim=1)  # [b, hq, n, d]
    logits = (k @ mean.unsqueeze(-1)).squeeze(-1) / math.sqrt(d)
    if cov is not None:
        logits = logits + ((k @ cov) * k).sum(-1) / (2 * d)
    if scored is not None:
        logits = logits.masked_fill(~scored.repeat_interleave(group, dim=1), float("-inf"))
    probs = logits.softmax(dim=-1).nan_to_num(0.0).view(b, hk, group, n).mean(dim=2)  # nan: nothing scored
    if values is not None:
        probs = (probs + epsilon) * values.to(probs.dtype).norm(dim=-1)
    return probs


@register
@dataclass
class ExpectedAttention(Policy):
    name = "expected-attention"
    rule = ("keep the keys the next n_future_positions queries are expected to attend to (Gaussian query "
            "statistics of the last query_window queries, rotated ahead by RoPE), times |v|")

    n_future_positions: int = 512
    n_sink_tokens: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0
    query_window: int = 512

    def validate(self) -> None:
        if not isinstance(self.n_future_positions, int) or self.n_future_positions <= 0:
            raise ValueError(f"n_future_positions: must be an integer > 0, got {self.n_future_positions!r}")
        if not isinstance(self.n_sink_tokens, int) or self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: must be an integer >= 0, got {self.n_sink_tokens!r}")
        if not isinstance(self.query_window, int) or self.query_window <= 0:
            raise ValueError(f"query_window: must be an integer > 0, got {self.query_window!r}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon: must be >= 0, got {self.epsilon}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def needs(self) -> PolicyNeeds:
        """The layer's recent queries (its own window, chosen by ``ctx.layer_idx``), RoPE ahead and values."""
        return PolicyNeeds(queries=QueryNeed(self.query_window, self.n_future_positions, self.n_sink_tokens),
                           values=self.use_vnorm)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, hk, n, d]`` → ``[b, hk, n]`` from ``ctx.queries`` (window, RoPE ahead) and ``ctx.values``;
        only real tokens past the sinks (``n_sink_tokens <= position < seen``) are scored."""
        recent = ctx.queries
        if recent is None:
            raise ValueError("queries: expected-attention scores from the recent queries the engine passes "
                             "(ScoreContext.queries); none were given")
        mean, cov = window_statistics(recent.queries, recent.valid())
        scored = (ctx.positions >= self.n_sink_tokens) & (ctx.positions < ctx.seen)
        return self._scores(keys, scored, mean, cov, mean_rotation(recent.cos.to(mean.dtype), recent.sin.to(mean.dtype)),
                            ctx.values)

    def _scores(self, keys: torch.Tensor, scored: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor,
                rot: torch.Tensor, values: torch.Tensor | None) -> torch.Tensor:
        """Rotate the statistics by ``rot [b or 1, d, d]`` (or ``[d, d]``) and score ``keys``."""
        if self.use_vnorm and values is None:
            raise ValueError("values: needed when use_vnorm is true")
        rot = rot if rot.dim() == 3 else rot.unsqueeze(0)
        mean = mean @ rot.transpose(-1, -2)
        cov = rot.unsqueeze(1) @ cov @ rot.transpose(-1, -2).unsqueeze(1) if self.use_covariance else None
        return expected_attention_scores(keys, mean, cov, values if self.use_vnorm else None, scored, self.epsilon)

    def score_from(self, keys: torch.Tensor, positions: torch.Tensor, queries: torch.Tensor,
                   query_positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   values: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``[b, hk, n]`` of ``keys [b, hk, n, d]`` at ``positions [b, hk, n]``, from the step's
        ``queries [b, hq, t, d]`` before RoPE at ``query_positions [t]``, RoPE's ``cos``/``sin [n_future, d]`` at
        the look-ahead positions and the cached ``values [b, hk, n, d_v]`` (needed when ``use_vnorm``)."""
        if cos.shape[0] != self.n_future_positions:
            raise ValueError(f"cos: expected {self.n_future_positions} look-ahead positions, got {cos.shape[0]}")
        mean, cov = query_statistics(queries[:, :, query_positions >= self.n_sink_tokens])
        rot = mean_rotation(cos.to(mean.dtype), sin.to(mean.dtype))
        return self._scores(keys, positions >= self.n_sink_tokens, mean, cov, rot, values)
