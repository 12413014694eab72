"""Multi-head latent attention (DeepSeek-V2/V3): a cached token is one latent row and one shared rotary-key row per
layer; evicting it drops both, the bound counts those rows, and what such a cache does not hold is refused.
(Chunked without eviction = one pass and a batch = each alone: tests/keydiff/test_families.py.)"""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo.loading import load_model
from kdeval.keydiff.quant.rule import KVQuant

N, B = 32, 16


@pytest.fixture(scope="module")
def mla():
    return load_model("random:deepseek-v3-tiny", device="cpu").model


def test_latent_and_rotary_rows_are_evicted_together_within_n_plus_b(mla):
    cfg = mla.config
    rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    held = []
    eng = Engine(mla, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B),
                 on_step=lambda s: held.append([(l.length, l.keys.shape, l.values.shape) for l in s.cache.layers]))
    assert eng.plan.latent and eng.plan.group == cfg.num_attention_heads
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(0))
    res = eng.generate(ids, max_new_tokens=3)
    for step in held:
        for length, keys, values in step:
            assert length <= N and keys[1] == values[1] == 1 and keys[3] == rank and values[3] == rope
            assert keys[2] == values[2] <= N + B  # one slot buffer: a latent row and its rotary key per token
    kept = res.state.cache.layers[0].view()[1]
    assert kept.shape == (1, 1, N) and len(set(kept[0, 0].tolist())) == N
    # the K/V bytes are the latent and rotary rows of N + B slots per layer, float32
    assert res.stats.peak_kv_bytes == cfg.num_hidden_layers * (N + B) * (rank + rope) * 4


def test_one_token_id_at_two_positions_scores_apart(mla):
    """KeyDiff scores a token's whole cached row (latent and rotary key): the latent alone carries no position."""
    from kdeval.keydiff.cache.layouts import scored_keys

    eng = Engine(mla, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B))
    state = eng.prefill(torch.tensor([[7] * 20]))
    layer = state.cache.layers[0]
    keys, values = layer.view()[0], layer.values[:, :, : layer.length]
    assert torch.equal(keys[0, 0, 3], keys[0, 0, 9])  # the same latent at positions 3 and 9
    rows = scored_keys(eng.plan, keys, values)
    assert rows.shape[-1] == keys.shape[-1] + values.shape[-1] and not torch.equal(rows[0, 0, 3], rows[0, 0, 9])


@pytest.mark.parametrize("policy,what", [("cur", "reads the cached values"),
                                         ("expected-attention", "reads the cached values"),
                                         ("ada", "shares a layer's slots among its KV heads"),
                                         ("sink-rerotate", "re-rotates its kept keys")])
def test_what_a_latent_cache_does_not_hold_is_refused_in_one_line(mla, policy, what):
    with pytest.raises(ValueError) as e:
        Engine(mla, get_policy(policy), EngineConfig(budget=N, chunk_size=B))
    assert str(e.value) == (f"policy: '{policy}' {what}, which a multi-head latent attention (MLA) cache does not "
                            f"hold (it keeps one compressed latent and one shared rotary key a token)")


def test_kv_quant_is_refused_on_a_latent_cache(mla):
    with pytest.raises(ValueError, match=r"^kv_quant: a multi-head latent attention \(MLA\) cache is not quantized"):
        Engine(mla, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B, kv_quant=KVQuant(bits=4, group_size=8)))


def test_fewer_kv_heads_than_query_heads_runs_and_chunked_equals_one_pass():
    """DeepSeek-V3 with 4 query heads over num_key_value_heads 2 (transformers builds it): expand_kv already gives
    every query head its key, so nothing is repeated again (it failed inside SDPA with 8 key heads for 4 query heads,
    under every policy, once a chunk had a mask)."""
    mla2 = load_model("random:deepseek-v3-tiny", device="cpu", overrides={"num_key_value_heads": 2}).model
    ids = torch.randint(0, 256, (1, 90), generator=torch.Generator().manual_seed(3))
    lasts = []
    for chunk in (B, 90):
        state = Engine(mla2, get_policy("full"), EngineConfig(chunk_size=chunk)).prefill(ids)
        lasts.append(state.last_logits[0].float())
    assert all(m.num_key_value_groups == 1 for m in mla2.modules() if hasattr(m, "expand_kv"))
    with torch.no_grad():
        reference = mla2(ids).logits[0, -1]  # one pass of transformers itself, no cache
    assert torch.allclose(lasts[0], lasts[1], atol=1e-5) and torch.allclose(lasts[1], reference, atol=1e-5)
    res = Engine(mla2, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B)).generate(ids, max_new_tokens=2)
    assert res.state.cache.layers[0].length == N
