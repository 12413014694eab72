"""Shared prompt steps (kdeval/keydiff/step/shared.py): every registered policy gives, through a store other cells fill,
exactly what it gives alone — tokens, kept positions, keys and values, per-token state, KV bytes — under both
protocols, chunked and one-shot; a cell forks at the step it first evicts, not a step later or earlier."""
import pytest
import torch

import kdeval.keydiff.step.shared as shared_mod
from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff.cache.state_layer import RecurrentStates, StateLayer
from kdeval.keydiff.step.shared import SharedSteps, forward_signature

from ..keydiff.helpers import make_engine, prompt, tiny

N, L, QUESTION, NEW = 48, 150, 20, 5
POLICIES = policy_names()


def generate(policy: str, chunk: int, protect: int, store: SharedSteps | None, budget: int = N, model=None):
    lm = model or tiny("random:llama-tiny", 2)
    eng = make_engine(lm.model, get_policy(policy), budget=budget, chunk_size=chunk)
    with eng.sharing(store):
        return eng, eng.generate(prompt(L, seed=3), max_new_tokens=NEW, protect_last=protect)


def assert_same(got, ref) -> None:
    assert got.tokens == ref.tokens
    assert got.stats.peak_kv_bytes == ref.stats.peak_kv_bytes and got.stats.kv_cache_bytes == ref.stats.kv_cache_bytes
    assert got.stats.peak_kv_tokens == ref.stats.peak_kv_tokens and got.stats.kept_tokens == ref.stats.kept_tokens
    assert torch.equal(got.state.last_logits, ref.state.last_logits)
    for a, b in zip(got.state.cache.layers, ref.state.cache.layers):
        if isinstance(a, RecurrentStates):  # a recurrent layer's states: as alone, bit for bit
            sa, sb = a.states(), b.states()
            assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        if isinstance(a, StateLayer):
            continue
        ka, pa, sa = a.view()
        kb, pb, sb = b.view()
        assert torch.equal(pa, pb) and torch.equal(ka, kb)
        assert torch.equal(a.values[:, :, : ka.shape[2]], b.values[:, :, : kb.shape[2]])  # merging rewrites them
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def group_store(chunk: int) -> SharedSteps:
    return SharedSteps([get_policy(p) for p in POLICIES], max_tokens=2 * N + chunk)


@pytest.mark.parametrize("chunk", [16, L])  # chunked, and one-shot (the whole prompt in one chunk)
@pytest.mark.parametrize("protect", [0, QUESTION])  # the paper's protocol, kvpress's (the question kept)
def test_every_policy_through_a_shared_store_equals_alone(chunk, protect):
    store = group_store(chunk)
    generate("full", chunk, protect, store)  # records the trunk every cell shares
    replayed = {}
    for policy in POLICIES:
        for budget in (N, 2 * N):
            before = store.replayed
            _, got = generate(policy, chunk, protect, store, budget)
            _, ref = generate(policy, chunk, protect, None, budget)
            assert_same(got, ref)
            replayed[policy, budget] = store.replayed - before
            assert got.stats.replayed_steps == replayed[policy, budget] and ref.stats.replayed_steps == 0
    # what shares: SDPA-output policies replay; a head-shared pool (ada) never does
    assert replayed["keydiff", N] > 0 and replayed["snapkv", N] > 0 and replayed["expected-attention", N] > 0
    assert replayed["ada", N] == 0


@pytest.mark.parametrize("model", ["random:qwen3.5-tiny", "random:falcon-h1-tiny", "random:gemma3n-tiny"])
def test_recurrent_and_kv_shared_models_through_a_shared_store_equal_alone(model):
    """On a recurrent hybrid (linear layers; attention and Mamba in one layer) a replayed step restores the states
    its recording left (keys alone cannot resume a recurrent layer); on a KV-shared model (Gemma 3n) the layers
    that read an earlier layer's keys see its kept set. Every cell through the store equals itself alone, states,
    keys and tokens, bit for bit."""
    lm = tiny(model)
    store = SharedSteps([get_policy(p) for p in ("keydiff", "snapkv", "tova")], max_tokens=2 * N + 16)
    generate("full", 16, 0, store, model=lm)
    for policy in ("keydiff", "snapkv", "tova"):
        before = store.replayed
        _, got = generate(policy, 16, 0, store, model=lm)
        _, ref = generate(policy, 16, 0, None, model=lm)
        assert_same(got, ref)
        assert store.replayed - before == got.stats.replayed_steps > 0
        states = [layer.states() for layer in got.state.cache.state_layers]
        assert all(states) == (model != "random:gemma3n-tiny")  # gemma3n's shared layers hold nothing of their own


def test_fork_at_the_first_evicting_chunk():
    """Chunks of 16 and N=48: chunks 1-3 leave 16, 32, 48 tokens (no eviction), chunk 4 leaves 64 > 48 and is
    the last a cell replays; from chunk 5 on it computes its own."""
    store = group_store(16)
    generate("full", 16, 0, store)
    for budget, replays in ((N, 4), (2 * N, 7), (40, 3)):
        _, got = generate("keydiff", 16, 0, store, budget)
        assert got.stats.replayed_steps == replays


def test_a_fork_one_chunk_late_is_caught(monkeypatch):
    """A store that kept serving a cell one chunk after its first eviction would hand it keys computed over
    tokens it had evicted: the equality above then fails (this is what guards the fork point)."""
    def one_chunk_late(state, plan=None):
        cache = state.cache
        return all(layer.length >= state.seen - 16 and not layer.pending for layer in cache.layers)

    monkeypatch.setattr(shared_mod, "undiverged", one_chunk_late)
    store = group_store(16)
    generate("full", 16, 0, store)
    _, got = generate("keydiff", 16, 0, store)
    _, ref = generate("keydiff", 16, 0, None)
    assert got.stats.replayed_steps == 5
    with pytest.raises(AssertionError):
        assert_same(got, ref)


def test_the_store_holds_at_most_the_largest_budget_plus_a_chunk():
    store = SharedSteps([get_policy("keydiff")], max_tokens=N + 16)
    generate("full", 16, 0, store)
    held = sum(rec.keys[0].shape[2] for rec in store.records.values())
    assert held <= N + 16 and held == 64  # chunks 1-4: what a cell of N=48 replays
    store.clear()
    assert not store.records


def test_steps_under_different_attention_do_not_meet():
    """H2O's output comes from its captured probabilities and PyramidKV runs its own per-layer attention:
    neither replays a step SDPA computed, nor does SDPA replay theirs."""
    lm = tiny("random:llama-tiny", 2)
    plans = {p: make_engine(lm.model, get_policy(p), budget=N, chunk_size=16).plan
             for p in ("keydiff", "snapkv", "full", "h2o", "pyramidkv", "ada")}
    sig = {p: forward_signature(plan) for p, plan in plans.items()}
    assert sig["keydiff"] == sig["snapkv"] == sig["full"]
    assert len({sig["keydiff"], sig["h2o"], sig["pyramidkv"]}) == 3 and sig["ada"] is None
    store = group_store(16)
    generate("h2o", 16, 0, store)
    _, got = generate("keydiff", 16, 0, store)
    assert got.stats.replayed_steps == 0


def test_decode_steps_are_never_shared():
    store = group_store(16)
    _, full = generate("full", 16, 0, store, budget=None)
    assert full.state.history is None  # decoding ends the history
    _, again = generate("full", 16, 0, store, budget=None)
    assert again.tokens == full.tokens
    assert again.stats.replayed_steps == 7  # the prompt's chunks within the bound (7 x 16 <= 2N + 16), no decode step
