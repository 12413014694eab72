"""A cell forked from the shared trunk, then batched across samples (``Engine.prefill_shared`` then
``Engine.generate_batch(states=...)``): every registered policy gives each prompt of a ragged batch exactly what
that batch gives alone — tokens, kept positions, keys and values, per-token state, KV bytes and token counts —
under both protocols; the fork is the step the cell first evicts, and one chunk off breaks the equality."""
import pytest
import torch

import kdeval.keydiff.engine as engine_mod
import kdeval.keydiff.step.shared as shared_mod
from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff.step.shared import SharedSteps

from kdeval.zoo.loading import load_model

from ..keydiff.helpers import kept_positions, make_engine, prompt

N, B, QUESTION, NEW = 48, 16, 20, 5
LENGTHS = (150, 139, 121)  # ragged: each prompt forks at its own point of its own steps
POLICIES = policy_names()


@pytest.fixture(scope="module")
def lm():
    """float64, weights large enough that kept sets change the tokens: a batch's shapes move float32 logits in
    their last bits (tests/keydiff/test_batching.py), float64 ones by less than 1e-10."""
    return load_model("random:llama-tiny", device="cpu", dtype="float64",
                      overrides={"num_key_value_heads": 2, "initializer_range": 0.1})


def prompts():
    return [prompt(n, seed=3 + i)[0] for i, n in enumerate(LENGTHS)]


def stores() -> list[SharedSteps]:
    return [SharedSteps([get_policy(p) for p in POLICIES], max_tokens=2 * N + B) for _ in LENGTHS]


def forked(eng, ids, trunks, protect):
    """Each prompt replayed (or recorded) to its fork through its own store, then the rests in one batch."""
    states = []
    for x, store, p in zip(ids, trunks, protect):
        with eng.sharing(store):
            states.append(eng.prefill_shared(x.unsqueeze(0), p))
    rests = [x[s.seen:] for x, s in zip(ids, states)]
    return states, eng.generate_batch(rests, max_new_tokens=NEW, states=states, protect_last=protect)


def assert_rows_same(got, ref) -> None:
    for g, r in zip(got, ref):
        assert g.tokens == r.tokens
        for field in ("peak_kv_bytes", "kv_cache_bytes", "peak_kv_tokens", "kept_tokens", "prompt_tokens",
                      "decode_tokens"):
            assert getattr(g.stats, field) == getattr(r.stats, field), field
        assert g.state.seen == r.state.seen and g.state.protected == r.state.protected
        assert g.state.steps == r.state.steps
        for x, y in zip(kept_positions(g.state), kept_positions(r.state)):
            assert torch.equal(x, y)
        close = lambda x, y: torch.allclose(x, y, rtol=0, atol=1e-10)  # noqa: E731
        assert close(g.state.last_logits, r.state.last_logits)
        for a, b in zip(g.state.cache.layers, r.state.cache.layers):
            (ka, _, sa), (kb, _, sb) = a.view(), b.view()
            assert close(ka, kb) and close(a.values[:, :, : ka.shape[2]], b.values[:, :, : kb.shape[2]])
            assert sa.keys() == sb.keys() and all(close(sa[k], sb[k]) for k in sa)


def test_every_policy_forked_then_batched_equals_its_batch_alone(lm):
    ids = prompts()
    protect = [QUESTION, 0, QUESTION]  # kvpress's protocol (the question kept) beside the paper's, in one batch
    trunks = stores()
    full = make_engine(lm.model, get_policy("full"), budget=None, chunk_size=B)
    states, _ = forked(full, ids, trunks, protect)  # `full` records each prompt's trunk, up to the bound
    # chunks of 16 while the store's bound (2N + B = 112) holds; the third context (101 tokens, its question
    # protected) ends in a chunk of 5, its question left for the batch
    ends = [112, 112, 101]
    assert [s.seen for s in states] == ends
    shared = {}
    for policy in POLICIES:
        for budget in (N, 2 * N):
            eng = make_engine(lm.model, get_policy(policy), budget=budget, chunk_size=B)
            before = [t.replayed for t in trunks]
            states, got = forked(eng, ids, trunks, protect)
            ref = eng.generate_batch(ids, max_new_tokens=NEW, protect_last=protect)
            assert_rows_same(got, ref)
            shared[policy, budget] = ([s.seen for s in states], [t.replayed - b for t, b in zip(trunks, before)])
    # a cell forks after its first evicting chunk: N // B + 1 chunks of 16 (4 at N=48, 7 at N=96)
    assert shared["keydiff", N] == ([64] * 3, [4] * 3) and shared["snapkv", 2 * N] == (ends, [7] * 3)
    assert shared["expected-attention", N][1] == [4] * 3
    assert shared["ada", N] == ([0] * 3, [0] * 3)  # a head-shared pool never shares a step


def test_trunks_recorded_in_one_batch_serve_every_policy_its_batch_alone(lm):
    """``Engine.record_shared`` records the three prompts' trunks as rows of one forward per chunk: the full chunks
    every prompt records (6: the third context's protected question ends its trunk at 101 tokens), each row under
    the key its batch-1 step has. Every policy replayed from them (its later chunks recorded at batch 1) gives
    its batch alone."""
    ids = prompts()
    protect = [QUESTION, 0, QUESTION]
    trunks = stores()
    full = make_engine(lm.model, get_policy("full"), budget=None, chunk_size=B)
    assert full.record_shared(ids, trunks, protect) == 6
    assert [t.recorded for t in trunks] == [6] * 3 and [t.replayed for t in trunks] == [0] * 3
    assert full.record_shared(ids, trunks, protect) == 0  # recorded already: nothing runs twice
    states, got = forked(full, ids, trunks, protect)  # replays the six, records the rest of each trunk at batch 1
    assert [t.replayed for t in trunks] == [6] * 3 and [t.recorded for t in trunks] == [7, 7, 7]
    assert_rows_same(got, full.generate_batch(ids, max_new_tokens=NEW, protect_last=protect))
    for policy in POLICIES:
        eng = make_engine(lm.model, get_policy(policy), budget=2 * N, chunk_size=B)
        before = [t.replayed for t in trunks]
        states, got = forked(eng, ids, trunks, protect)
        assert_rows_same(got, eng.generate_batch(ids, max_new_tokens=NEW, protect_last=protect))
        if policy == "keydiff":  # its fork at step 7: six steps from the batch, the seventh from full's record
            assert [t.replayed - b for t, b in zip(trunks, before)] == [7, 7, 7]


def test_a_fork_one_chunk_late_is_caught(lm, monkeypatch):
    """Feeding one more replayed chunk after the first eviction would hand the cell keys of a state it no longer
    holds: the equality above then fails (this guards where prefill_shared stops)."""
    def one_chunk_late(state, plan=None):
        return all(layer.length >= state.seen - B and not layer.pending for layer in state.cache.layers)

    monkeypatch.setattr(shared_mod, "undiverged", one_chunk_late)  # the store keeps serving it
    monkeypatch.setattr(engine_mod, "undiverged", one_chunk_late)  # and prefill_shared keeps feeding
    ids = prompts()
    eng = make_engine(lm.model, get_policy("keydiff"), budget=N, chunk_size=B)
    trunks = stores()
    forked(make_engine(lm.model, get_policy("full"), budget=None, chunk_size=B), ids, trunks, [0] * 3)
    states, got = forked(eng, ids, trunks, [0] * 3)
    assert [s.seen for s in states] == [80] * 3  # one chunk past the fork at 64
    with pytest.raises(AssertionError):
        assert_rows_same(got, eng.generate_batch(ids, max_new_tokens=NEW))


def test_prefill_shared_needs_a_store_and_one_prompt(lm):
    eng = make_engine(lm.model, get_policy("keydiff"), budget=N, chunk_size=B)
    with pytest.raises(ValueError, match="prefill_shared: needs a shared store"):
        eng.prefill_shared(prompt(40))
