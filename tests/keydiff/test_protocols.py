"""The two evaluation protocols on one engine, decoding with and without eviction, and the KV-cache bytes.

The paper's protocol (defaults) evicts every chunk of the whole prompt and every generated token; kvpress's
(``protect_last=len(question)``) evicts while prefilling the context only and never evicts the question.
"""
import functools

import pytest
import torch
from transformers.cache_utils import DynamicCache

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.loop.memory import model_weight_bytes
from kdeval.zoo.loading import load_model

from .helpers import assert_same_run, kept_positions, make_engine, prompt
from .oracles import EMULATED, GATHER, STORES


@functools.lru_cache(maxsize=None)
def lively(dtype: str = "float64"):
    """llama-tiny (3 layers, 2 KV heads of 16) with larger random weights: greedy tokens vary from step to step
    and eviction changes them (the default initialisation gives the same token at every step)."""
    return load_model("random:llama-tiny", device="cpu", dtype=dtype, overrides={"initializer_range": 0.1})


def per_token_bytes(lm) -> int:
    """Bytes one token costs in the K/V tensors of all layers: layers x kv_heads x head_dim x 2 x itemsize."""
    cfg = lm.model.config
    itemsize = next(lm.model.parameters()).element_size()
    return cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * itemsize


def one_shot_reference(model, ids: torch.Tensor, n_context: int, budget: int, max_new: int):
    """Prefill the context in one forward with a full cache, keep the ``budget`` tokens per layer and KV head
    KeyDiff keeps (score ``-cos(k_i, mean_j k_j/|k_j|)``, highest kept), then feed the question and decode
    greedily without eviction. Returns (tokens, question logits ``[1, Q, vocab]``, decode logits
    ``[1, max_new - 1, vocab]``, kept context positions per layer ``[1, kv_heads, budget]``)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :n_context], past_key_values=cache, use_cache=True)
        kept = []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # [1, kv_heads, n_context, head_dim]
            unit = k / k.norm(dim=-1, keepdim=True)
            anchor = unit.mean(dim=2, keepdim=True)
            score = -(unit * (anchor / anchor.norm(dim=-1, keepdim=True))).sum(-1)  # [1, kv_heads, n_context]
            keep = score.topk(budget, dim=-1).indices.sort(dim=-1).values
            idx = keep.unsqueeze(-1).expand(*keep.shape, k.shape[-1])
            layer.keys, layer.values = k.gather(2, idx), v.gather(2, idx)
            kept.append(keep)
        n = ids.shape[1]
        out = model(ids[:, n_context:], position_ids=torch.arange(n_context, n).unsqueeze(0),
                    past_key_values=cache, use_cache=True)
        question_logits, logits = out.logits, out.logits[:, -1]
        tokens, decode_logits = [], []
        for i in range(max_new):
            nxt = logits.argmax(-1)
            tokens.append(int(nxt))
            if i == max_new - 1:
                break
            out = model(nxt.view(1, 1), position_ids=torch.tensor([[n + i]]), past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
            decode_logits.append(out.logits)
    return tokens, question_logits, torch.cat(decode_logits, dim=1), kept


ENGINES = {
    "slot": {},
    "gather": GATHER,
    "static": {"cuda_graphs": True, **EMULATED},  # the graph path's layout, thawed for the question
}


@pytest.mark.parametrize("store", list(ENGINES))
def test_context_then_question_equals_one_shot_compression(store):
    """One chunk covers the context: kvpress's protocol with decode="keep" is one-shot KeyDiff compression
    of the context followed by plain generation (same tokens, logits within 1e-10 in float64)."""
    lm = lively()
    n_context, n_question, budget, max_new = 60, 10, 24, 8
    ids = prompt(n_context + n_question, seed=4)
    ref_tokens, ref_q_logits, ref_decode_logits, ref_kept = one_shot_reference(lm.model, ids, n_context, budget,
                                                                               max_new)
    eng = make_engine(lm.model, get_policy("keydiff"), budget=budget, chunk_size=64, **ENGINES[store])
    res = eng.generate(ids, max_new_tokens=max_new, protect_last=n_question, decode_evict=False)
    assert res.tokens[0] == ref_tokens
    tail = torch.arange(n_context, n_context + n_question + max_new - 1)
    for got, keep in zip(kept_positions(res.state), ref_kept):
        assert torch.equal(got, torch.cat([keep, tail.expand(*keep.shape[:2], -1)], dim=-1))

    # the logits, in float64 (collected chunk logits are float32): the question's last, then every decode step's
    state = eng.prefill(ids[:, :n_context])
    state = eng.prefill(ids[:, n_context:], state, collect_logits=True, evict=False)
    assert (state.logits - ref_q_logits).abs().max().item() < 1e-5
    assert (state.last_logits - ref_q_logits[:, -1]).abs().max().item() < 1e-10
    for i, token in enumerate(ref_tokens[:-1]):
        state = eng.prefill(torch.tensor([[token]]), state, evict=False)
        assert (state.last_logits - ref_decode_logits[:, i]).abs().max().item() < 1e-10


def test_one_shot_reference_is_not_the_full_cache():
    """The comparison above is not vacuous: without compression the same prompt generates other tokens."""
    lm = lively()
    ids = prompt(70, seed=4)
    ref_tokens = one_shot_reference(lm.model, ids, 60, 24, 8)[0]
    full = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=64)).generate(ids, max_new_tokens=8)
    assert full.tokens[0] != ref_tokens


@pytest.mark.parametrize("store", list(ENGINES))
@pytest.mark.parametrize("policy", ["keydiff", "snapkv", "h2o", "tova"])
def test_question_never_evicted_and_cache_bounded(policy, store):
    params = {"window": 8} if policy == "snapkv" else {}
    """Under kvpress's protocol the context phase holds at most N + B tokens, the question's Q tokens are never
    evicted, and decode eviction keeps N + Q tokens (N + Q + 1 during a decode forward)."""
    lm = lively()
    n_context, n_question, budget, chunk, max_new = 100, 12, 24, 16, 10
    question = range(n_context, n_context + n_question)
    steps = []

    def check(state):
        lengths = {layer.length for layer in state.cache.layers}
        assert len(lengths) == 1  # every layer keeps as many tokens
        length = lengths.pop()
        if state.seen <= n_context:
            assert length == min(budget, state.seen) and state.peak_kv_tokens <= budget + chunk
        else:
            n_q = min(state.seen, n_context + n_question) - n_context
            assert length == budget + n_q
            for positions in kept_positions(state):
                for row in positions.reshape(-1, positions.shape[-1]).tolist():
                    assert set(range(n_context, n_context + n_q)) <= set(row) and len(set(row)) == len(row)
            assert state.peak_kv_tokens <= budget + max(chunk, n_question + 1)
        steps.append(state.seen)

    eng = make_engine(lm.model, get_policy(policy, **params), check, budget=budget, chunk_size=chunk,
                      **ENGINES[store])
    res = eng.generate(prompt(n_context + n_question, seed=2), max_new_tokens=max_new, protect_last=n_question)
    assert len(res.tokens[0]) == max_new
    # ceil(100 / 16) context chunks, one question chunk, then max_new - 1 decode steps
    assert len(steps) == 7 + 1 + max_new - 1
    assert res.stats.kept_tokens == budget + n_question
    assert res.stats.peak_kv_tokens == max(budget + chunk, budget + n_question + 1)
    assert res.state.protected == [(question.start, question.stop)] and res.state.n_protected == n_question


@pytest.mark.parametrize("store", list(ENGINES))
def test_decode_keep_grows_by_one_token_per_step_evict_stays_at_budget(store):
    """decode_evict=False: after G generated tokens the cache holds what the prompt left plus G - 1 (the last
    token is never fed); with eviction it stays at the budget (plus the protected question)."""
    lm = lively()
    budget, chunk, max_new, n_question = 24, 16, 9, 7
    ids = prompt(90, seed=6)
    eng = make_engine(lm.model, get_policy("keydiff"), budget=budget, chunk_size=chunk, **ENGINES[store])
    for protect, after_prompt in ((0, budget), (n_question, budget + n_question)):
        keep = eng.generate(ids, max_new_tokens=max_new, protect_last=protect, decode_evict=False)
        assert len(keep.tokens[0]) == max_new
        assert keep.stats.kept_tokens == after_prompt + max_new - 1
        assert keep.stats.peak_kv_tokens == max(budget + chunk, after_prompt + max_new - 1)
        evict = eng.generate(ids, max_new_tokens=max_new, protect_last=protect)
        assert evict.stats.kept_tokens == after_prompt
        for layer in evict.state.cache.layers:
            assert layer.length == after_prompt


def test_protocols_and_stores_agree():
    """The static layout (graph path, thawed for the question or the decode steps) and
    the gather store keep the same tokens as the slot store under both protocols and both decode modes."""
    lm = lively()
    ids = prompt(130, seed=8)
    for protect in (0, 11):
        for decode_evict in (True, False):
            runs = [make_engine(lm.model, get_policy("keydiff"), budget=40, chunk_size=16, **extra)
                    .generate(ids, max_new_tokens=12, protect_last=protect, decode_evict=decode_evict)
                    for extra in ENGINES.values()]
            for other in runs[1:]:
                assert_same_run(other, runs[0], atol=1e-9)


def test_thawed_static_cache_returns_to_the_pool_with_its_graphs():
    """A static cache thawed for the question goes back to the engine's pool: the next request reuses it and
    its captured steps (no new capture)."""
    lm = lively()
    eng = Engine(lm.model, get_policy("keydiff"),
                 EngineConfig(budget=40, chunk_size=16, cuda_graphs=True), **EMULATED)
    first = eng.generate(prompt(120, seed=1), max_new_tokens=4, protect_last=9)
    assert first.state.cache.static_base is None and first.state.cache.thawed_from == 40
    pooled = eng.step.caches.spare(1)
    graphs = dict(pooled.graphs)
    assert graphs  # the context's full chunks were captured
    eng.release(first.state)  # a thawed cache is not pooled in its place
    assert eng.step.caches.spare(1) is pooled
    second = eng.generate(prompt(120, seed=2), max_new_tokens=4, protect_last=9)
    assert pooled.graphs == graphs  # the same captured steps, none added
    # a thawed state continues on the engine that made it (eagerly)
    more = eng.generate(prompt(5, seed=3), max_new_tokens=2, state=second.state)
    assert more.stats.prompt_tokens == 120 + 3 + 5


def test_default_generation_is_unchanged():
    """The defaults are the paper's protocol exactly as before the protocols existed: tokens and kept sets
    recorded from the engine before ``protect_last`` / ``decode_evict`` were added (float64)."""
    import hashlib

    lm = lively()
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(11))
    recorded = {
        "keydiff": ([9, 199, 140, 100, 87, 37, 225, 186, 207, 68, 0, 209], "a0ce794c7a7d"),
        "snapkv": ([192, 106, 18, 257, 219, 30, 18, 257, 207, 249, 89, 249], "2b07c0647a9e"),
        "h2o": ([6, 166, 6, 242, 108, 185, 153, 208, 39, 220, 223, 93], "b31b8907e60e"),
        "tova": ([237, 68, 190, 108, 108, 192, 59, 18, 83, 208, 202, 140], "b5c0c7e069a5"),
        "full": ([166, 2, 59, 165, 99, 188, 143, 115, 67, 89, 237, 195], "3656cb3e1a11"),
    }
    for policy, (tokens, digest) in recorded.items():
        for extra in ENGINES.values():
            res = make_engine(lm.model, get_policy(policy), budget=40, chunk_size=16, **extra).generate(
                ids, max_new_tokens=12)
            held = [layer.view()[1].sort(-1).values.tolist() for layer in res.state.cache.layers]
            assert res.tokens[0] == tokens, (policy, extra)
            assert hashlib.sha256(str(held).encode()).hexdigest()[:12] == digest, (policy, extra)


def test_protect_last_out_of_range_refused():
    eng = Engine(lively().model, get_policy("keydiff"), EngineConfig(budget=8, chunk_size=4))
    with pytest.raises(ValueError, match=r"protect_last: expected 0 \.\. 10 prompt tokens, got 11"):
        eng.generate(prompt(10), max_new_tokens=2, protect_last=11)


# ---------------------------------------------------------------- KV-cache bytes


def test_peak_kv_bytes_flat_under_a_budget_growing_for_the_full_cache():
    """keydiff at N, B holds N + B tokens at its peak whatever the prompt length (> N + B); the full cache grows
    with the prompt (the prompt and all but the last generated token at the last decode step), whatever the
    store allocated around it (the slot store: prompt + max_new_tokens slots at once)."""
    lm = lively()
    per_token = per_token_bytes(lm)
    assert per_token == 3 * 2 * 16 * 2 * 8
    budget, chunk, max_new = 32, 16, 4
    peaks = {}
    for policy in ("keydiff", "full"):
        for store in ("slot", "gather"):
            eng = Engine(lm.model, get_policy(policy), EngineConfig(budget=budget, chunk_size=chunk), **STORES[store])
            for n in (100, 140):
                stats = eng.generate(prompt(n, seed=n), max_new_tokens=max_new).stats
                peaks[policy, store, n] = stats.peak_kv_bytes
                assert stats.memory_kind == "process_rss"
    for store in ("slot", "gather"):
        assert peaks["keydiff", store, 100] == peaks["keydiff", store, 140] == (budget + chunk) * per_token
    for store in ("slot", "gather"):
        assert peaks["full", store, 100] == (100 + max_new - 1) * per_token
        assert peaks["full", store, 140] == (140 + max_new - 1) * per_token


def test_peak_kv_bytes_under_kvpress_protocol():
    """Context at N + B, then room for the question and the decode steps allocated once: the slot store's
    buffers end at N + Q + (max_new - 1) tokens with decode="keep", N + Q + 1 with decode="evict"."""
    lm = lively()
    per_token = per_token_bytes(lm)
    budget, chunk, n_question, max_new = 32, 16, 30, 6
    ids = prompt(150, seed=3)
    for store, extra in (("slot", {}), ("static", ENGINES["static"])):
        eng = make_engine(lm.model, get_policy("keydiff"), budget=budget, chunk_size=chunk, **extra)
        keep = eng.generate(ids, max_new_tokens=max_new, protect_last=n_question, decode_evict=False).stats
        assert keep.peak_kv_bytes == (budget + n_question + max_new - 1) * per_token, store
        evict = eng.generate(ids, max_new_tokens=max_new, protect_last=n_question).stats
        assert evict.peak_kv_bytes == (budget + n_question + 1) * per_token, store
    short = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=budget, chunk_size=chunk)).generate(
        ids, max_new_tokens=max_new, protect_last=4).stats
    assert short.peak_kv_bytes == (budget + chunk) * per_token  # the question fits the chunk's slots


def test_model_weight_bytes_known_answer():
    """llama-tiny in float64: the tied embedding once (259 x 128), per layer q, k, v, o (128x128, 128x32 twice,
    128x128), the MLP (3 x 128 x 256) and two norms (128), the final norm; plus the two float32 rotary
    buffers of 8."""
    lm = load_model("random:llama-tiny", device="cpu", dtype="float64")
    per_layer = 128 * 128 * 2 + 128 * 32 * 2 + 3 * 128 * 256 + 2 * 128
    assert model_weight_bytes(lm.model) == (259 * 128 + 3 * per_layer + 128) * 8 + 2 * 8 * 4


@pytest.mark.parametrize("store", list(ENGINES))
def test_prefill_with_a_protected_question_is_the_context_then_the_question(store):
    """``prefill(ids, protect_last=q)`` feeds the context evicting, then the question protected: the same state as
    two calls (``prefill(context)``, ``prefill(question, evict=False)``), and what ``generate`` continues from."""
    lm = lively()
    ids = prompt(70, seed=4)
    eng = make_engine(lm.model, get_policy("keydiff"), budget=24, chunk_size=16, **ENGINES[store])
    one = eng.prefill(ids, protect_last=10)
    two = eng.prefill(ids[:, 60:], eng.prefill(ids[:, :60]), evict=False)
    assert (one.seen, one.steps, one.protected) == (two.seen, two.steps, two.protected) == (70, 5, [(60, 70)])
    assert all(torch.equal(a, b) for a, b in zip(kept_positions(one), kept_positions(two)))
    assert torch.equal(one.last_logits, two.last_logits)
    for bad in (-1, 71, 2.5, True):
        with pytest.raises(ValueError, match=r"^protect_last: expected 0 \.\. 70 prompt tokens, got "):
            eng.prefill(ids, protect_last=bad)
