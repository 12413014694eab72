"""Chunked prefill without eviction is the same computation as one forward pass."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig

from .helpers import prompt, tiny
from .oracles import STORES

TOL = 1e-4  # float32; observed differences are ~1e-6


@pytest.mark.parametrize("model_name", ["random:llama-tiny", "random:qwen2-tiny"])
@pytest.mark.parametrize("chunk", [1, 7, 32, 100])
@pytest.mark.parametrize("store", ["slot", "gather"])
def test_full_chunked_equals_one_pass(model_name, chunk, store):
    lm = tiny(model_name)
    ids = prompt(100)
    ref = lm.model(ids).logits
    state = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=chunk), **STORES[store]).prefill(
        ids, collect_logits=True)
    assert state.logits.shape == ref.shape
    assert (state.logits - ref).abs().max().item() < TOL


@pytest.mark.parametrize("policy", ["keydiff", "keydiff-mean", "keydiff-sw"])
def test_budget_at_least_prompt_equals_one_pass(policy):
    lm = tiny("random:qwen2-tiny")
    ids = prompt(90)
    ref = lm.model(ids).logits
    state = Engine(lm.model, get_policy(policy), EngineConfig(budget=90, chunk_size=16)).prefill(ids, collect_logits=True)
    assert (state.logits - ref).abs().max().item() < TOL
    assert state.cache.length == 90


def test_eviction_changes_logits():
    """The equivalence above is not vacuous: a budget below the prompt length changes later logits."""
    lm = tiny()
    ids = prompt(120)
    ref = lm.model(ids).logits
    state = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=20)).prefill(ids, collect_logits=True)
    assert (state.logits[:, :40] - ref[:, :40]).abs().max().item() < TOL
    assert (state.logits[:, 60:] - ref[:, 60:]).abs().max().item() > 1e-3


def test_batch_of_two_matches_each_alone():
    lm = tiny()
    ids = prompt(80, batch=2, seed=3)
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=30, chunk_size=16))
    both = eng.generate(ids, max_new_tokens=6)
    for r in range(2):
        alone = eng.generate(ids[r : r + 1], max_new_tokens=6)
        assert alone.tokens[0] == both.tokens[r]
        for la, lb in zip(alone.state.cache.layers, both.state.cache.layers):
            pa = la.view()[1][0].sort(-1).values
            pb = lb.view()[1][r].sort(-1).values
            assert torch.equal(pa, pb)


def test_generation_equals_transformers_greedy_without_eviction():
    lm = tiny()
    ids = prompt(50, seed=5)
    ref = lm.model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 50:].tolist()
    res = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=16)).generate(ids, max_new_tokens=8)
    assert res.tokens[0] == ref
