"""ExpectedAttention (kvpress' ``ExpectedAttentionPress``, Devoto et al. 2025): keep the keys future queries are
expected to attend to, from the statistics of recent queries and the RoPE rotation ahead; no attention matrix.

The rule, per layer:

1. Statistics window: the step's queries *before RoPE*, ``[b, q_heads, t, d]`` (the chunk's ``t`` queries;
   with one chunk covering the prompt, the prompt's, as kvpress), less those at positions ``< n_sink_tokens``
   (outliers). Their mean ``mu`` and (biased) covariance ``cov`` per query head.
2. Look-ahead: the next ``n_future_positions`` positions after the step, ``seen .. seen + n_future - 1``.
   The mean of RoPE's rotation over them, ``R`` (:func:`mean_rotation`), turns the statistics into those of a
   future query: ``mu' = R mu``, ``cov' = R cov R^T``.
3. A query ``q ~ N(mu', cov')`` gives ``E[exp(q . k / sqrt(d))] = exp(mu' . k / sqrt(d) + k^T cov' k / (2 d))``
   (kvpress' scaling of the variance term); the softmax of these logits over the cached keys other than the
   sinks, averaged over the query heads of each KV head, times ``|v|`` (``use_vnorm``, after adding
   ``epsilon``) is the score. Sinks are protected by the engine.

Not registered: the policy interface gives ``score(keys, ctx)`` the keys, their positions and attention rows,
but this rule needs three more inputs, which only the engine can supply:

- the step's queries before RoPE ``[b, q_heads, t, d]`` (captured attention rows are softmax probabilities summed
  over queries: neither the queries' mean nor their covariance can be recovered from them);
- RoPE's ``cos``/``sin`` ``[n_future, d]`` at the look-ahead positions (the model's rotary embedding);
- the cached values ``[b, kv_heads, n, d_v]``, for ``use_vnorm``.

:meth:`ExpectedAttention.score_from` computes the scores from those inputs; ``bench/kvpress_parity.py``
checks it against kvpress on the real model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdeval.keydiff.policy import Policy, ScoreContext


def query_statistics(queries: torch.Tensor, skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``queries [b, hq, t, d]`` (before RoPE) → mean ``[b, hq, d]`` and biased covariance ``[b, hq, d, d]``
    of the queries after the first ``skip``."""
    q = queries[:, :, skip:].to(torch.promote_types(queries.dtype, torch.float32))
    mean = q.mean(dim=2)
    centred = q - mean.unsqueeze(2)
    return mean, centred.transpose(-1, -2) @ centred / q.shape[2]


def mean_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation averaged over positions: ``cos``/``sin [positions, d]`` (the model's rotary embedding,
    halves duplicated as transformers lays them out) → ``[d, d]``, the mean of ``diag(cos) + diag(sin) P`` with
    ``P x = rotate_half(x) = (-x2, x1)``."""
    d = cos.shape[-1]
    half = torch.eye(d // 2, dtype=cos.dtype, device=cos.device)
    p = torch.zeros(d, d, dtype=cos.dtype, device=cos.device)
    p[: d // 2, d // 2 :], p[d // 2 :, : d // 2] = -half, half
    return torch.diag_embed(cos).mean(0) + (sin.unsqueeze(-1) * p).mean(0)


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


@dataclass
class ExpectedAttention(Policy):
    name = "expected-attention"
    rule = ("keep the keys the next n_future_positions queries are expected to attend to (Gaussian query "
            "statistics rotated ahead by RoPE), times |v|")

    n_future_positions: int = 512
    n_sink_tokens: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    def validate(self) -> None:
        if not isinstance(self.n_future_positions, int) or self.n_future_positions <= 0:
            raise ValueError(f"n_future_positions: must be an integer > 0, got {self.n_future_positions!r}")
        if not isinstance(self.n_sink_tokens, int) or self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: must be an integer >= 0, got {self.n_sink_tokens!r}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon: must be >= 0, got {self.epsilon}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        raise NotImplementedError(
            "expected-attention: the engine does not pass policies the step's pre-RoPE queries, RoPE's cos/sin "
            "ahead or the values (see kdeval/baselines/expected_attention.py); use score_from")

    def score_from(self, keys: torch.Tensor, positions: torch.Tensor, queries: torch.Tensor,
                   query_positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   values: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``[b, hk, n]`` of ``keys [b, hk, n, d]`` at ``positions [b, hk, n]``, from the step's
        ``queries [b, hq, t, d]`` before RoPE at ``query_positions [t]``, RoPE's ``cos``/``sin [n_future, d]`` at
        the look-ahead positions and the cached ``values [b, hk, n, d_v]`` (needed when ``use_vnorm``)."""
        if self.use_vnorm and values is None:
            raise ValueError("values: needed when use_vnorm is true")
        if cos.shape[0] != self.n_future_positions:
            raise ValueError(f"cos: expected {self.n_future_positions} look-ahead positions, got {cos.shape[0]}")
        window = queries[:, :, query_positions >= self.n_sink_tokens]
        mean, cov = query_statistics(window)
        rot = mean_rotation(cos.to(mean.dtype), sin.to(mean.dtype))
        mean = mean @ rot.T
        cov = rot @ cov @ rot.T if self.use_covariance else None
        return expected_attention_scores(keys, mean, cov, values if self.use_vnorm else None,
                                         positions >= self.n_sink_tokens, self.epsilon)
