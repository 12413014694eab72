"""ExpectedAttention's rule (kvpress' ExpectedAttentionPress), from the inputs the engine does not pass yet."""
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kdeval.baselines import policy_names
from kdeval.baselines.expected_attention import (ExpectedAttention, expected_attention_scores, mean_rotation,
                                                 query_statistics)
from kdeval.keydiff.policy import ScoreContext

from ..keydiff.helpers import tiny


def test_query_statistics_are_the_mean_and_biased_covariance_after_the_skipped_queries():
    queries = torch.tensor([[9.0, 9.0], [1.0, 0.0], [3.0, 2.0]]).view(1, 1, 3, 2)
    mean, cov = query_statistics(queries, skip=1)  # (1,0), (3,2): mean (2,1), deviations -/+(1,1)
    assert mean.tolist() == [[[2.0, 1.0]]]
    assert cov.tolist() == [[[[1.0, 1.0], [1.0, 1.0]]]]


def test_mean_rotation_of_two_angles():
    """d = 2, angles 0 and pi/2: the mean of [[1, 0], [0, 1]] and [[0, -1], [1, 0]]."""
    cos, sin = torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert mean_rotation(cos, sin).tolist() == [[0.5, -0.5], [0.5, 0.5]]


def test_mean_rotation_is_the_mean_of_ropes_rotations():
    """R q equals the mean over the look-ahead positions of transformers' own RoPE applied to q."""
    model = tiny().model
    q = torch.randn(1, 1, 1, model.config.hidden_size // model.config.num_attention_heads, dtype=torch.float64)
    positions = torch.arange(40, 40 + 64).view(1, -1)
    cos, sin = model.model.rotary_emb(q.float(), positions)
    cos, sin = cos[0].double(), sin[0].double()  # [64, d]
    rotated, _ = apply_rotary_pos_emb(q.expand(1, 1, 64, -1), q.expand(1, 1, 64, -1), cos[None], sin[None])
    assert torch.allclose(q[0, 0, 0] @ mean_rotation(cos, sin).T, rotated[0, 0].mean(0), atol=1e-12)


# keys k1 (1, 0), k2 (0, 1), k3 (1, 1); d = 2, so logits are mean . k / sqrt 2 + k^T cov k / 4.
KEYS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).view(1, 1, 3, 2)
MEAN = torch.tensor([[2.0, 0.0], [0.0, 2.0]]).view(1, 2, 2)  # two query heads share the KV head
COV = torch.stack([torch.diag(torch.tensor([1.0, 0.0])), torch.zeros(2, 2)]).view(1, 2, 2, 2)
# head 0: logits sqrt2 + 1/4, 0, sqrt2 + 1/4 -> softmax .456759, .086482, .456759
# head 1: logits 0, sqrt2, sqrt2              -> softmax .108383, .445808, .445808


def test_scores_are_the_softmax_of_the_expected_logits_averaged_over_the_group():
    got = expected_attention_scores(KEYS, MEAN, COV)
    assert got[0, 0].tolist() == pytest.approx([0.282571, 0.266145, 0.451284], abs=1e-6)


def test_value_norms_and_unscored_sinks():
    values = torch.tensor([[3.0, 4.0], [2.0, 0.0], [0.0, 0.5]]).view(1, 1, 3, 2)  # |v| = 5, 2, .5
    got = expected_attention_scores(KEYS, MEAN[:, :1], COV[:, :1], values=values, epsilon=0.1)
    assert got[0, 0].tolist() == pytest.approx([(0.456759 + 0.1) * 5, (0.086482 + 0.1) * 2, (0.456759 + 0.1) * 0.5],
                                               abs=1e-5)
    # k1 a sink: the softmax runs over k2, k3 only: logits 0, sqrt2 + 1/4
    got = expected_attention_scores(KEYS, MEAN[:, :1], COV[:, :1], scored=torch.tensor([[[False, True, True]]]))
    e = math.exp(math.sqrt(2) + 0.25)
    assert got[0, 0].tolist() == pytest.approx([0.0, 1 / (1 + e), e / (1 + e)], abs=1e-6)


def test_score_from_rotates_the_chunks_statistics_ahead():
    """score_from = the statistics of the queries at positions >= n_sink, rotated by the mean rotation."""
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(1, 2, 12, 4, generator=g), torch.randn(1, 2, 12, 4, generator=g)
    queries, positions = torch.randn(1, 4, 12, 4, generator=g), torch.arange(12).expand(1, 2, 12)
    angles = torch.arange(12, 20).float().unsqueeze(1) * torch.tensor([1.0, 0.1, 1.0, 0.1])
    pol = ExpectedAttention(n_future_positions=8, n_sink_tokens=2)
    got = pol.score_from(keys, positions, queries, torch.arange(12), angles.cos(), angles.sin(), values)
    mean, cov = query_statistics(queries, skip=2)
    rot = mean_rotation(angles.cos(), angles.sin())
    want = expected_attention_scores(keys, mean @ rot.T, rot @ cov @ rot.T, values, positions >= 2)
    assert torch.allclose(got, want)
    assert (got[..., :2] == 0).all()  # sinks: not scored (the engine protects them)


def test_not_registered_and_says_what_the_engine_must_pass():
    assert "expected-attention" not in policy_names()
    pol = ExpectedAttention()
    with pytest.raises(NotImplementedError, match="pre-RoPE queries.*values"):
        pol.score(KEYS, ScoreContext(0, torch.arange(3).view(1, 1, 3), 3, 3))


@pytest.mark.parametrize("params,msg", [
    (dict(n_future_positions=0), r"n_future_positions: must be an integer > 0, got 0"),
    (dict(n_sink_tokens=-1), r"n_sink_tokens: must be an integer >= 0, got -1"),
    (dict(epsilon=-1.0), r"epsilon: must be >= 0, got -1.0"),
])
def test_bad_parameters(params, msg):
    with pytest.raises(ValueError, match=msg):
        ExpectedAttention(**params)
