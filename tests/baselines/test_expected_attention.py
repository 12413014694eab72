"""ExpectedAttention (kvpress' ExpectedAttentionPress): its rule on hand-worked inputs, the query window the engine
keeps, and what the engine passes the policy (checked against queries recomputed from the model's own layers)."""
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kdeval.baselines import policy_names
from kdeval.baselines.expected_attention import (ExpectedAttention, expected_attention_scores, mean_rotation,
                                                 query_statistics, window_statistics)
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.keydiff.policy.selection import protect
from kdeval.keydiff.attention.queries import QueryWindow

from ..keydiff.helpers import kept_positions, prompt, tiny


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


def test_registered_and_refuses_a_context_without_queries():
    assert "expected-attention" in policy_names()
    with pytest.raises(ValueError, match=r"queries: expected-attention scores from the recent queries"):
        ExpectedAttention().score(KEYS, ScoreContext(0, torch.arange(3).view(1, 1, 3), 3, 3))


def test_window_statistics_count_only_the_valid_queries():
    """Row 0 holds (1,0), (3,2) (the first entry is empty); row 1 holds nothing: zeros."""
    queries = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 2.0]]).view(1, 1, 3, 2).repeat(2, 1, 1, 1)
    mean, cov = window_statistics(queries, torch.tensor([[False, True, True], [False, False, False]]))
    assert mean.tolist() == [[[2.0, 1.0]], [[0.0, 0.0]]]
    assert cov.tolist() == [[[[1.0, 1.0], [1.0, 1.0]]], [[[0.0, 0.0], [0.0, 0.0]]]]


def test_query_window_keeps_each_rows_last_admitted_queries_in_order():
    """Window of 3; a query is the number of its position; row 1 left-padded (not admitted) in the first step."""
    win = QueryWindow(3)

    def step(values, admit):
        q = torch.tensor(values, dtype=torch.float64).view(2, 1, -1, 1)
        win.push({0: q}, torch.tensor(admit))

    step([[1, 2], [0, 7]], [[True, True], [False, True]])
    assert win.queries[0].view(2, 3).tolist() == [[0, 1, 2], [0, 0, 7]] and win.count.tolist() == [2, 1]
    step([[3, 4], [8, 9]], [[True, False], [True, True]])  # row 0's 4: a sink, never admitted
    assert win.queries[0].view(2, 3).tolist() == [[1, 2, 3], [7, 8, 9]] and win.count.tolist() == [3, 3]
    step([[5, 6], [10, 11]], [[True, True], [True, True]])
    assert win.queries[0].view(2, 3).tolist() == [[3, 5, 6], [9, 10, 11]]
    picked = win.rows(torch.tensor([1]))
    assert picked.queries[0].view(1, 3).tolist() == [[9, 10, 11]] and picked.count.tolist() == [3]


def recomputed_queries(model, ids):
    """Per layer, the queries before RoPE ``[1, hq, L, d]`` of one full forward, recomputed from each layer's input
    (its ``input_layernorm`` then ``q_proj``), and that forward's cache."""
    out = model(ids, use_cache=True, output_hidden_states=True)
    d = model.config.hidden_size // model.config.num_attention_heads
    qs = []
    for layer, hidden in zip(model.model.layers, out.hidden_states):
        q = layer.self_attn.q_proj(layer.input_layernorm(hidden))
        qs.append(q.view(1, ids.shape[1], -1, d).transpose(1, 2))
    return qs, out.past_key_values


class Recording(ExpectedAttention):
    """Records, after every step, what the engine passed for each layer."""

    def observe(self, ctx):
        self.seen_steps.append((ctx.layer_idx, int(ctx.seen), ctx.queries, ctx.values.clone(), ctx.positions.clone()))


@torch.inference_mode()
def test_engine_passes_the_last_window_of_queries_rope_ahead_and_values():
    """No eviction (budget > prompt), chunks of 16, window 20, sinks 4: after the chunk ending at ``s`` each layer
    sees the queries at positions ``max(4, s - 20) .. s - 1``, RoPE at ``s .. s + 7`` and the values at ``0 .. s - 1``."""
    model = tiny("random:llama-tiny", 2, "float64").model
    ids = prompt(60, seed=5)
    pol = Recording(n_future_positions=8, n_sink_tokens=4, query_window=20)
    pol.seen_steps = []
    Engine(model, pol, EngineConfig(budget=100, chunk_size=16)).prefill(ids)
    queries, cache = recomputed_queries(model, ids)
    ahead = lambda s: model.model.rotary_emb(queries[0], torch.arange(s, s + 8).view(1, -1))  # noqa: E731
    assert sorted({s for _, s, *_ in pol.seen_steps}) == [16, 32, 48, 60]
    for layer, s, recent, values, positions in pol.seen_steps:
        lo = max(4, s - 20)
        want = torch.zeros(1, queries[layer].shape[1], 20, queries[layer].shape[-1], dtype=torch.float64)
        want[:, :, 20 - (s - lo):] = queries[layer][:, :, lo:s]
        assert recent.count.tolist() == [s - lo]
        assert torch.allclose(recent.queries, want, atol=1e-10)
        cos, sin = ahead(s)
        assert torch.equal(recent.cos, cos) and torch.equal(recent.sin, sin)
        assert torch.equal(positions[0, 0], torch.arange(s))  # the slot store keeps them in order until it evicts
        assert torch.allclose(values, cache.layers[layer].values[:, :, :s], atol=1e-10)


@torch.inference_mode()
def test_one_chunk_keeps_what_the_rule_keeps_on_recomputed_inputs():
    """One chunk covering the prompt, window >= prompt: per layer the kept set is the top N of ``score_from`` fed the
    recomputed queries, the model's RoPE after the prompt and the one-pass cache (sinks protected)."""
    model = tiny("random:llama-tiny", 2, "float64").model
    L, N = 48, 20
    ids = prompt(L, seed=9)
    pol = ExpectedAttention(n_future_positions=16, query_window=64)
    state = Engine(model, pol, EngineConfig(budget=N, chunk_size=L)).prefill(ids)
    queries, cache = recomputed_queries(model, ids)
    cos, sin = model.model.rotary_emb(queries[0], torch.arange(L, L + 16).view(1, -1))
    for layer, (got, q, kv) in enumerate(zip(kept_positions(state), queries, cache.layers)):
        positions = torch.arange(L).expand(1, kv.keys.shape[1], L)
        scores = pol.score_from(kv.keys, positions, q, torch.arange(L), cos[0], sin[0], kv.values)
        want = protect(scores, positions, L, pol.n_sink(), 0).topk(N, dim=-1).indices.sort(-1).values
        assert torch.equal(got, want), f"layer {layer}"


@pytest.mark.parametrize("params,msg", [
    (dict(n_future_positions=0), r"n_future_positions: must be an integer > 0, got 0"),
    (dict(n_sink_tokens=-1), r"n_sink_tokens: must be an integer >= 0, got -1"),
    (dict(epsilon=-1.0), r"epsilon: must be >= 0, got -1.0"),
    (dict(query_window=0), r"query_window: must be an integer > 0, got 0"),
])
def test_bad_parameters(params, msg):
    with pytest.raises(ValueError, match=msg):
        ExpectedAttention(**params)
