"""StreamingLLM with key re-rotation (``sink-rerotate``): the kept keys hold contiguous RoPE positions, recomputed
here from the model's own layer-0 projections; without eviction it is ``sink``; with eviction it generates
otherwise than ``sink`` from the same kept positions."""
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo.loading import load_model
from kdeval.keydiff.attention.rerotation import rerotate, rotate, rotation

from ..keydiff.helpers import assert_ragged_batch_matches_alone, assert_same_run, kept_positions, prompt, tiny
from ..keydiff.oracles import EMULATED, STORES


def layer0_keys(model, ids: torch.Tensor) -> torch.Tensor:
    """Layer 0's keys before RoPE ``[1, kv_heads, L, d]``: its input is the embeddings, whatever the cache holds."""
    attn, cfg = model.model.layers[0].self_attn, model.config
    hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    d = cfg.hidden_size // cfg.num_attention_heads
    return attn.k_proj(hidden).view(1, ids.shape[1], -1, d).transpose(1, 2)


def at_positions(model, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' own RoPE of ``keys [1, h, n, d]`` at ``positions [n]``."""
    cos, sin = model.model.rotary_emb(keys, positions.view(1, -1))
    return apply_rotary_pos_emb(keys, keys, cos, sin)[1]


@torch.inference_mode()
def test_rotating_by_a_delta_moves_a_rotated_key_there():
    model = tiny("random:llama-tiny", 2, "float64").model
    keys = torch.randn(1, 2, 5, 16, dtype=torch.float64)
    old, new = torch.tensor([3, 9, 40, 41, 90]), torch.tensor([0, 1, 2, 3, 4])
    cos, sin = rotation(model, (new - old).expand(1, 2, 5), keys)
    moved = rotate(at_positions(model, keys, old), cos, sin)
    assert torch.allclose(moved, at_positions(model, keys, new), atol=1e-5)
    assert not torch.allclose(at_positions(model, keys, old), at_positions(model, keys, new), atol=1e-2)


@torch.inference_mode()
def test_rerotate_gives_each_kept_key_its_rank():
    """Held before: positions 0, 2, 5, 7 at RoPE positions 0..3; 2 is dropped: 5 and 7 move down by one."""
    model = tiny("random:llama-tiny", 2, "float64").model
    pre = torch.randn(1, 1, 3, 16, dtype=torch.float64)
    stored = at_positions(model, pre, torch.tensor([0, 2, 3])).clone()  # positions 0, 5, 7 at ranks 0, 2, 3
    positions = torch.tensor([[[0, 7, 5]]])  # slot order is not position order
    stored = stored[:, :, [0, 2, 1]]
    rerotate(model, stored, positions, torch.tensor([[[0, 2, 5, 7]]]))
    want = at_positions(model, pre, torch.tensor([0, 1, 2]))[:, :, [0, 2, 1]]
    assert torch.allclose(stored, want, atol=1e-5)


@pytest.mark.parametrize("store", ["slot", "gather"])
@torch.inference_mode()
def test_kept_keys_are_their_pre_rope_keys_at_contiguous_positions(store):
    """Budget 24, chunks of 16, 4 sinks: after the prompt of 60 and after 10 generated tokens, layer 0 holds the
    sinks and the last 20 tokens (absolute positions), their keys rotated at positions 0..23 in that order."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(60, seed=4)
    eng = Engine(lm.model, get_policy("sink-rerotate"), EngineConfig(budget=24, chunk_size=16), **STORES[store])
    checked = []

    def check(fed: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor):
        seen = fed.shape[1]
        want_positions = torch.cat([torch.arange(4), torch.arange(seen - 20, seen)])
        assert torch.equal(positions[0, 0].sort().values, want_positions)
        order = positions[0, 0].argsort()
        want = at_positions(lm.model, layer0_keys(lm.model, fed)[:, :, want_positions], torch.arange(24))
        assert torch.allclose(keys[:, :, order], want, atol=1e-5)
        checked.append(seen)

    state = eng.prefill(ids)
    keys, positions, _ = state.cache.layers[0].view()
    check(ids, positions, keys)
    res = eng.generate(prompt(1, seed=1), max_new_tokens=10, state=state)
    fed = torch.cat([ids, prompt(1, seed=1), torch.tensor([res.tokens[0][:-1]])], dim=1)
    keys, positions, _ = res.state.cache.layers[0].view()
    check(fed, positions, keys)
    assert checked == [60, 70]


def test_without_eviction_it_is_sink():
    """Prompt 20 + 10 generated tokens under a budget of 40: nothing is evicted, so nothing is re-rotated."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(20, seed=2)
    runs = [Engine(lm.model, get_policy(p), EngineConfig(budget=40, chunk_size=8)).generate(ids, max_new_tokens=10)
            for p in ("sink-rerotate", "sink")]
    assert_same_run(*runs, atol=0.0, rtol=0.0)
    for a, b in zip(runs[0].state.cache.layers, runs[1].state.cache.layers):
        assert torch.equal(a.view()[0], b.view()[0])


def test_with_eviction_it_keeps_sinks_positions_and_generates_otherwise():
    lm = load_model("random:llama-tiny", device="cpu", dtype="float64", overrides={"initializer_range": 0.1})
    ids = prompt(90, seed=0)
    runs = [Engine(lm.model, get_policy(p), EngineConfig(budget=24, chunk_size=16)).generate(ids, max_new_tokens=12)
            for p in ("sink-rerotate", "sink")]
    for a, b in zip(kept_positions(runs[0].state), kept_positions(runs[1].state)):
        assert torch.equal(a, b)
    assert runs[0].tokens != runs[1].tokens


def test_runs_eagerly_and_a_ragged_batch_equals_each_request_alone():
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = Engine(lm.model, get_policy("sink-rerotate"), EngineConfig(budget=24, chunk_size=16, cuda_graphs=True),
                 **EMULATED)
    assert not eng.plan.use_graphs and eng.plan.rerotate
    assert_ragged_batch_matches_alone(get_policy("sink-rerotate"))


@pytest.mark.parametrize("policy", ["sink-rerotate", "expected-attention"])
def test_a_model_without_a_rotary_embedding_is_refused_up_front(policy):
    lm = load_model("random:llama-tiny", device="cpu")
    del lm.model.model.rotary_emb
    with pytest.raises(ValueError, match=r"model: LlamaForCausalLM has no rotary embedding \(rotary_emb\)"):
        Engine(lm.model, get_policy(policy), EngineConfig(budget=24))


def test_a_state_of_the_other_position_scheme_is_refused_once_it_evicted():
    lm = tiny("random:llama-tiny", 2)
    engines = {p: Engine(lm.model, get_policy(p), EngineConfig(budget=24, chunk_size=16)) for p in ("sink", "sink-rerotate")}
    for made, other in (("sink", "sink-rerotate"), ("sink-rerotate", "sink")):
        fresh = engines[made].prefill(prompt(20))  # nothing evicted: both schemes hold the same keys
        engines[other].generate(prompt(3), max_new_tokens=2, state=fresh.fork())
        assert engines[other].generate(prompt(9), max_new_tokens=2, state=fresh).state.cache.rerotated == (
            other == "sink-rerotate")  # continued and evicted by the other scheme: its keys are that scheme's now
        evicted = engines[made].prefill(prompt(40))
        with pytest.raises(ValueError, match=rf"state: its kept keys are rotated at .* positions, policy '{other}' "
                                             rf"expects .* ones; continue it with the policy that made it"):
            engines[other].generate(prompt(3), max_new_tokens=2, state=evicted)
