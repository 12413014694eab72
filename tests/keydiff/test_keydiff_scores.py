"""KeyDiff's selection against independent references."""
import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.keydiff import keydiff_scores

from .helpers import prompt, tiny
from .oracles import STORES


def _np_keydiff(keys: np.ndarray) -> np.ndarray:
    """keys [n, d] → -cos(k_i, mean of unit keys), written with numpy only."""
    unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    anchor = unit.mean(axis=0)
    return -(unit @ anchor) / np.linalg.norm(anchor)


def test_anchor_and_pairwise_rank_known_outliers_first():
    # 20 keys near e0, 3 outliers pointing along e1, e2, -e0: the outliers are the most distinct.
    g = torch.Generator().manual_seed(0)
    keys = torch.zeros(1, 1, 23, 8)
    keys[0, 0, :20, 0] = 1.0
    keys[0, 0, :20] += 0.05 * torch.randn(20, 8, generator=g)
    keys[0, 0, 20, 1] = 1.0
    keys[0, 0, 21, 2] = 1.0
    keys[0, 0, 22, 0] = -1.0
    for anchor in ("normalized", "pairwise"):
        top3 = keydiff_scores(keys, anchor).topk(3).indices[0, 0]
        assert set(top3.tolist()) == {20, 21, 22}
        assert keydiff_scores(keys, anchor).argmax().item() == 22  # opposite direction is the least similar
    a = keydiff_scores(keys, "normalized")[0, 0]
    p = keydiff_scores(keys, "pairwise")[0, 0]
    assert torch.equal(a.argsort(), p.argsort())


def test_anchor_ranks_like_pairwise_on_random_keys():
    keys = torch.randn(2, 3, 50, 16, generator=torch.Generator().manual_seed(1))
    a = keydiff_scores(keys, "normalized")
    p = keydiff_scores(keys, "pairwise")
    assert torch.equal(a.argsort(-1), p.argsort(-1))
    m = keydiff_scores(keys + 3.0, "mean")  # the raw-mean anchor is a different rule
    assert m.shape == a.shape


@pytest.mark.parametrize("store", ["slot", "gather"])
def test_single_chunk_kept_set_equals_numpy_reference(store):
    lm = tiny()
    ids = prompt(60)
    cache = DynamicCache()
    with torch.no_grad():
        lm.model(ids, past_key_values=cache, use_cache=True)
    state = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=20, chunk_size=60), **STORES[store]).prefill(ids)
    for li, layer in enumerate(state.cache.layers):
        ref_keys = cache.layers[li].keys[0].numpy()  # [kv_heads, 60, d]
        held = layer.view()[1][0]
        for h in range(ref_keys.shape[0]):
            expect = set(np.argsort(-_np_keydiff(ref_keys[h]))[:20].tolist())
            assert set(held[h].tolist()) == expect


def test_multi_chunk_kept_set_equals_reference_loop():
    """A reference written here: DynamicCache, numpy scores, explicit gather after each chunk."""
    lm = tiny("random:qwen2-tiny")
    ids, budget, chunk = prompt(75, seed=2), 25, 10
    cache = DynamicCache()
    pos = [np.zeros((2, 0), dtype=np.int64) for _ in range(3)]
    with torch.no_grad():
        for s in range(0, 75, chunk):
            piece = ids[:, s : s + chunk]
            lm.model(piece, past_key_values=cache, use_cache=True,
                     position_ids=torch.arange(s, s + piece.shape[1]).unsqueeze(0))
            for li, layer in enumerate(cache.layers):
                pos[li] = np.concatenate([pos[li], np.tile(np.arange(s, s + piece.shape[1]), (2, 1))], axis=1)
                n = layer.keys.shape[2]
                if n <= budget:
                    continue
                keep = np.stack([np.sort(np.argsort(-_np_keydiff(layer.keys[0, h].numpy()))[:budget]) for h in range(2)])
                idx = torch.from_numpy(keep)[None, :, :, None].expand(1, 2, budget, layer.keys.shape[-1])
                layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
                pos[li] = np.take_along_axis(pos[li], keep, axis=1)
    state = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=budget, chunk_size=chunk)).prefill(ids)
    for li, layer in enumerate(state.cache.layers):
        held = layer.view()[1][0].sort(-1).values.numpy()
        assert np.array_equal(held, pos[li])


def test_sliding_window_variant_keeps_the_newest_tokens():
    lm = tiny()
    state = Engine(lm.model, get_policy("keydiff", window_fraction=0.5), EngineConfig(budget=20, chunk_size=8)).prefill(prompt(64))
    for layer in state.cache.layers:
        held = layer.view()[1]
        for row in held.reshape(-1, held.shape[-1]):
            assert set(range(54, 64)) <= set(row.tolist())


def test_sink_tokens_are_kept():
    lm = tiny()
    state = Engine(lm.model, get_policy("keydiff", n_sink_tokens=4), EngineConfig(budget=12, chunk_size=8)).prefill(prompt(64))
    for layer in state.cache.layers:
        held = layer.view()[1]
        for row in held.reshape(-1, held.shape[-1]):
            assert {0, 1, 2, 3} <= set(row.tolist())
