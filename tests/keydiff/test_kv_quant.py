"""The quantized KV store (kdeval/keydiff/quant/store.py) in the engine: what it holds against a float64 oracle of
its definition, its bytes by hand, every policy storing quantized tokens under both protocols, a batch and a
shared store giving exactly what a cell gives alone."""
import numpy as np
import pytest
import torch

from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff import EngineConfig
from kdeval.keydiff.step.shared import SharedSteps

from .helpers import assert_same_run, make_engine, prompt, tiny
from .test_quant_rule import oracle_group

KIVI = {"bits": 4, "group_size": 4, "window": 8, "scheme": "kivi"}
PER_TOKEN = {"bits": 2, "group_size": 8, "window": 8, "scheme": "per_token"}
N = 40


def model():
    return tiny("random:llama-tiny", 2, "float64")  # head_dim 16, 3 layers, 2 KV heads


def test_one_shot_store_holds_the_oracle_codes_and_its_bytes():
    """The full cache, one chunk of 50 tokens, KIVI 4-bit, G=4, window 8: positions [0, 40) are stored (the
    frontier is 42 rounded down to a whole key group), keys per (head, 4 positions, channel), values per (token,
    4 channels); [40, 50) exactly as the model wrote them."""
    lm = model()
    ids = prompt(50, seed=1)
    raw = make_engine(lm.model, get_policy("full"), chunk_size=50).prefill(ids)
    got = make_engine(lm.model, get_policy("full"), chunk_size=50, kv_quant=KIVI).prefill(ids)
    for a, b in zip(got.cache.layers, raw.cache.layers):
        assert torch.equal(a.positions, b.positions)  # the full cache keeps position order
        k_raw, v_raw = b.keys[0].numpy(), b.values[0].numpy()
        k_want, v_want = k_raw.copy(), v_raw.copy()
        for h in range(2):
            for g in range(0, 40, 4):
                for c in range(16):
                    k_want[h, g : g + 4, c] = oracle_group(k_raw[h, g : g + 4, c], 4)
            for t in range(40):
                for c in range(0, 16, 4):
                    v_want[h, t, c : c + 4] = oracle_group(v_raw[h, t, c : c + 4], 4)
        np.testing.assert_allclose(a.keys[0].numpy(), k_want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.values[0].numpy(), v_want, rtol=0, atol=1e-12)
        assert torch.equal(a.keys[:, :, 40:], b.keys[:, :, 40:]) and not torch.equal(a.keys, b.keys)
    # by hand, per layer and KV head (float64: 8-byte scales): 40 stored tokens x (8 B key codes + 8 B value
    # codes + 4 value groups x 2 x 8 B) + 10 key groups x 16 channels x 2 x 8 B + 10 tokens x 32 x 8 B
    per_head = 40 * (8 + 8 + 64) + 10 * 256 + 10 * 32 * 8
    assert got.cache.nbytes() == 3 * 2 * per_head
    assert got.peak_kv_bytes == 3 * 2 * 50 * 32 * 8  # during the forward every token was still full precision
    assert raw.peak_kv_bytes == got.peak_kv_bytes


def test_a_window_past_the_prompt_changes_nothing():
    """Chunked, with eviction: a window longer than the run quantizes nothing, so the run is the 16-bit one."""
    lm = model()
    quant = dict(KIVI, window=200)
    for policy in ("keydiff",):
        ref = make_engine(lm.model, get_policy(policy), budget=N, chunk_size=16).generate(prompt(80), 4)
        got = make_engine(lm.model, get_policy(policy), budget=N, chunk_size=16, kv_quant=quant).generate(
            prompt(80), 4)
        assert got.tokens == ref.tokens and torch.equal(got.state.last_logits, ref.state.last_logits)
        for a, b in zip(got.state.cache.layers, ref.state.cache.layers):
            assert torch.equal(a.view()[0], b.view()[0])
        # the bytes it holds: N kept tokens in full precision (held, not the 16-bit N + B buffer's)
        assert got.stats.kv_cache_bytes == 3 * 2 * N * 32 * 8


def distinct_levels(x: torch.Tensor, groups: torch.Tensor) -> int:
    """The most distinct values of ``x [n]`` among entries sharing a group id ``groups [n]``."""
    pairs = torch.unique(torch.stack([groups.to(x.dtype), x]), dim=1)  # distinct (group, value)
    return int(torch.unique(pairs[0], return_counts=True)[1].max())


def assert_stored_quantized(result, quant: dict) -> None:
    """Every kept token older than the frontier is on its groups' grid: at most 2^bits values per group."""
    from kdeval.keydiff.quant.rule import KVQuant

    q = KVQuant.of(quant)
    frontier = q.frontier(result.state.seen)
    levels = 2**q.bits
    for layer in result.state.cache.layers:
        keys, positions, _ = layer.view()
        tags = layer.tags[:, :, : keys.shape[2]] if hasattr(layer, "tags") else None
        values = layer.values[:, :, : keys.shape[2]]
        for h in range(keys.shape[1]):
            pos = positions[0, h]
            old = pos < frontier
            assert old.any()
            v = values[0, h][old]
            assert distinct_levels(v.reshape(-1), torch.arange(v.numel()) // q.group_size) <= levels
            k = keys[0, h][old]
            if q.scheme == "kivi":  # per (KV head, key group, channel)
                head = tags[0, h][old] if tags is not None else torch.zeros_like(pos[old])
                grp = (head * 10_000 + pos[old] // q.group_size).view(-1, 1) * k.shape[1] + torch.arange(k.shape[1])
                assert distinct_levels(k.reshape(-1), grp.reshape(-1)) <= levels
            else:
                assert distinct_levels(k.reshape(-1), torch.arange(k.numel()) // q.group_size) <= levels


def test_every_policy_stores_its_kept_tokens_quantized():
    """Every registered policy, chunked, under both schemes and both protocols (each policy one of the four): the
    bound holds and the old kept tokens are stored on their groups' grid."""
    lm = model()
    for i, policy in enumerate(policy_names()):
        quant = (dict(KIVI, bits=2), PER_TOKEN)[i % 2]
        protect = 10 if (i // 2) % 2 else 0  # kvpress's protocol (the question kept) or the paper's
        pol = get_policy(policy)
        eng = make_engine(lm.model, pol, budget=32, chunk_size=16, kv_quant=quant)
        res = eng.generate(prompt(56, seed=i), max_new_tokens=2, protect_last=protect)
        if pol.evicts:
            assert res.stats.peak_kv_tokens <= max(pol.layer_budgets(32, 3)) + 16 + protect, policy
        assert res.stats.peak_kv_bytes < res.stats.peak_kv_tokens * 3 * 2 * 32 * 8, policy
        assert_stored_quantized(res, quant)


@pytest.mark.parametrize("policy", ["snapkv"])  # attention rows, the ragged layout's hardest read
def test_a_batch_equals_each_request_alone(policy):
    """The same tokens and kept positions as alone (what a batch row guarantees at 16 bits), and the same stored
    keys and values up to the float64 rounding a batched forward has at 16 bits too."""
    lm = model()
    eng = make_engine(lm.model, get_policy(policy), budget=N, chunk_size=16, kv_quant=KIVI)
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (37, 70, 5)]
    for ids, got in zip(ps, eng.generate_batch(ps, max_new_tokens=6)):
        ref = eng.generate(ids.unsqueeze(0), max_new_tokens=6)
        assert_same_run(got, ref)
        for a, b in zip(got.state.cache.layers, ref.state.cache.layers):
            (ka, pa, _), (kb, pb, _) = a.view(), b.view()
            oa, ob = pa.argsort(-1).unsqueeze(-1), pb.argsort(-1).unsqueeze(-1)
            for x, y in ((ka, kb), (a.values[:, :, : ka.shape[2]], b.values[:, :, : kb.shape[2]])):
                torch.testing.assert_close(x.gather(2, oa.expand_as(x)), y.gather(2, ob.expand_as(y)),
                                           rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk, quant", [(16, KIVI), (64, PER_TOKEN)])  # chunked and one-shot
def test_shared_execution_equals_alone(chunk, quant):
    """A store filled by 16-bit and quantized cells: each quantized cell gives what it gives alone, bytes included,
    and replays only steps of its own store (never a 16-bit cell's)."""
    lm = model()
    store = SharedSteps([get_policy(p) for p in ("full", "keydiff", "snapkv")], max_tokens=2 * N + chunk)

    def run(policy, budget, quant, shared):
        eng = make_engine(lm.model, get_policy(policy), budget=budget, chunk_size=chunk, kv_quant=quant)
        with eng.sharing(shared):
            return eng.generate(prompt(64, seed=5), max_new_tokens=4, protect_last=10)

    run("full", None, None, store)  # a 16-bit trunk
    before = store.replayed
    run("full", None, quant, store)  # a quantized trunk: none of the 16-bit steps serves it
    assert store.replayed == before
    for policy in ("keydiff", "snapkv"):
        got, ref = run(policy, N, quant, store), run(policy, N, quant, None)
        assert got.tokens == ref.tokens and torch.equal(got.state.last_logits, ref.state.last_logits)
        assert got.stats.peak_kv_bytes == ref.stats.peak_kv_bytes
        assert got.stats.kv_cache_bytes == ref.stats.kv_cache_bytes
        for a, b in zip(got.state.cache.layers, ref.state.cache.layers):
            assert torch.equal(a.view()[0], b.view()[0]) and torch.equal(a.view()[1], b.view()[1])
            assert torch.equal(a.values, b.values)
        assert got.stats.replayed_steps > 0  # it replayed the quantized trunk


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match=r"^kv_quant\.bits: expected one of \[2, 4, 8\], got 3$"):
        EngineConfig(kv_quant={"bits": 3})
    with pytest.raises(ValueError, match=r"^kv_quant\.group_size: expected a divisor of the model's head_dim 16, "
                                         r"got 6$"):
        make_engine(model().model, get_policy("keydiff"), budget=N, kv_quant={"group_size": 6})
