"""Hybrid models: windowed layers (sliding window, Llama 4's chunked attention) keep what the model sees, the
policy evicts the full-attention ones; GPT-OSS's attention sinks are in every softmax the engine computes.

The reference is the model itself: one forward of the whole prompt under transformers' own masks (sliding,
chunked, sinks in eager attention), no cache. A chunk boundary that saw its window wrong (a cached token the
query should not see, or one trimmed that it should) changes the last logits, which float64 shows exactly.
"""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.attention.layer_kinds import layer_kinds

WINDOW = 40
BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
TYPES = {"sliding": ["sliding_attention", "full_attention"] * 2, "chunked": ["chunked_attention", "full_attention"] * 2}
MODELS = {
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=TYPES["sliding"]),
    "llama4_text": dict(attention_chunk_size=WINDOW, layer_types=TYPES["chunked"], num_local_experts=2,
                        num_experts_per_tok=1, intermediate_size_mlp=128),
    "gpt_oss": dict(sliding_window=WINDOW, layer_types=TYPES["sliding"], num_local_experts=2, num_experts_per_tok=1),
    "mistral": dict(sliding_window=WINDOW),  # every layer sliding: the policy controls nothing
}
#: GPT-OSS's experts run in float32 only (grouped matmul); its eager softmax differs from SDPA's in rounding
DTYPE = {"gpt_oss": torch.float32}
ATOL = {torch.float64: 1e-10, torch.float32: 2e-5}
#: Llama 4 computes its rotary frequencies in float32 whatever the model's dtype, by a product whose rounding
#: follows the chunk's shape (a window seen wrong moves the logits by more than 1e-3)
ATOL_MODEL = {"llama4_text": 1e-6}

_cache: dict = {}


def hybrid(model_type: str):
    if model_type not in _cache:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **BASE, **MODELS[model_type])
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPE.get(model_type, torch.float64))
        _cache[model_type] = model.eval()
    return _cache[model_type]


def ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type,chunk", [(m, 16) for m in MODELS] + [("gemma3_text", 7), ("llama4_text", 7)])
def test_chunked_without_eviction_equals_the_models_one_pass_past_the_window(model_type, chunk):
    model = hybrid(model_type)
    prompt = ids(150)
    with torch.no_grad():
        want = model(prompt).logits[0, -1]
    state = Engine(model, get_policy("full"), EngineConfig(budget=None, chunk_size=chunk)).prefill(prompt)
    torch.testing.assert_close(state.last_logits[0], want, atol=ATOL_MODEL.get(model_type, ATOL[want.dtype]), rtol=0)
    for kind, layer in zip(layer_kinds(model.config), state.cache.layers):
        assert layer.length == (kind.kept_count(150) if kind.windowed else 150)


@pytest.mark.parametrize("model_type,policy", [("gemma3_text", p) for p in ("keydiff", "snapkv", "tova", "h2o",
                                                                             "pyramidkv")]
                         + [("llama4_text", "keydiff"), ("llama4_text", "pyramidkv")])
def test_windowed_layers_hold_their_window_and_full_layers_the_budget(model_type, policy):
    model = hybrid(model_type)
    kinds = layer_kinds(model.config)
    N, B = 36, 16
    seen = []
    eng = Engine(model, get_policy(policy), EngineConfig(budget=N, chunk_size=B), on_step=lambda s: check(s))
    budgets = eng.plan.budgets
    assert [b for b, k in zip(budgets, kinds) if k.windowed] == [k.most_kept() for k in kinds if k.windowed]
    full = [b for b, k in zip(budgets, kinds) if not k.windowed]
    # N is per full-attention layer: a per-layer allocation spreads it over those layers only
    assert full == [N, N] if policy != "pyramidkv" else sum(full) == 2 * N

    def check(state):
        for kind, budget, layer in zip(kinds, budgets, state.cache.layers):
            positions = layer.view()[1]
            if kind.windowed:  # exactly the positions the next query sees, in buffers of the window plus a chunk
                first = max(kind.first_kept(state.seen), 0)
                assert positions.sort(dim=-1).values[0, 0].tolist() == list(range(first, state.seen))
                assert layer.capacity <= kind.most_kept() + B
            else:
                assert layer.length == min(budget, state.seen) and layer.capacity <= budget + B
        seen.append(state.seen)

    res = eng.generate(ids(150), max_new_tokens=4)
    assert len(seen) == -(-150 // B) + len(res.tokens[0]) - 1
    assert res.stats.windowed_kv_bytes > 0 and res.stats.layer_kinds.startswith("4 layers: 2 full, 2 ")


@pytest.mark.parametrize("model_type,policy", [("gemma3_text", p) for p in ("keydiff", "snapkv", "tova", "h2o",
                                                                             "full")]
                         + [("llama4_text", "keydiff"), ("gpt_oss", "keydiff"), ("gpt_oss", "tova")])
def test_a_ragged_batch_keeps_what_each_request_keeps_alone(model_type, policy):
    model = hybrid(model_type)
    eng = Engine(model, get_policy(policy), EngineConfig(budget=None if policy == "full" else 36, chunk_size=16))
    prompts = [ids(110)[0], ids(23, seed=3)[0]]
    batch = eng.generate_batch(prompts, max_new_tokens=3)
    for p, got in zip(prompts, batch):
        alone = eng.generate(p.view(1, -1), max_new_tokens=3)
        assert got.tokens == alone.tokens
        for a, b in zip(got.state.cache.layers, alone.state.cache.layers):
            assert a.view()[1].sort(dim=-1).values.tolist() == b.view()[1].sort(dim=-1).values.tolist()


def test_kvpress_protocol_protects_the_question_in_full_layers_only():
    model = hybrid("gemma3_text")
    kinds = layer_kinds(model.config)
    question = 50  # longer than the window: the windowed layers still keep only their window
    res = Engine(model, get_policy("keydiff"), EngineConfig(budget=36, chunk_size=16)).generate(
        ids(150), max_new_tokens=1, protect_last=question)
    for kind, layer in zip(kinds, res.state.cache.layers):
        kept = set(layer.view()[1][0, 0].tolist())
        if kind.windowed:
            assert layer.length == kind.most_kept()
        else:
            assert set(range(100, 150)) <= kept and layer.length == 36 + question


@pytest.mark.parametrize("policy,why", [("ada", "shares a layer's slots among its KV heads"),
                                        ("sink-rerotate", "re-rotates its kept keys"),
                                        ("kvzip", "scores a repeat pass")])
def test_what_windowed_layers_cannot_take_is_refused_in_one_line(policy, why):
    with pytest.raises(ValueError) as e:
        Engine(hybrid("gemma3_text"), get_policy(policy), EngineConfig(budget=24, chunk_size=16))
    msg = str(e.value)
    assert msg.startswith(f"policy: '{policy}' {why}") and "windowed" in msg and "\n" not in msg


def test_graphs_are_off_on_windowed_layers_and_say_why():
    from tests.keydiff.oracles import EMULATED

    eng = Engine(hybrid("gemma3_text"), get_policy("keydiff"), EngineConfig(budget=24, chunk_size=16,
                                                                            cuda_graphs=True), **EMULATED)
    assert not eng.plan.use_graphs and "windowed layers" in eng.plan.graphs_off


def test_sink_logits_are_in_the_captured_attention_as_the_model_computes_them():
    """TOVA/SnapKV/H2O read softmax rows: with GPT-OSS's sinks they sum to less than one, as the model's do."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from kdeval.keydiff.attention.capture import AttentionCapture, AttentionNeed

    torch.manual_seed(0)
    b, hq, hk, t, m, d = 2, 4, 2, 5, 9, 16
    q, k, v = torch.randn(b, hq, t, d), torch.randn(b, hk, m, d), torch.randn(b, hk, m, d)
    sinks = torch.randn(hq)
    mask = torch.ones(t, m, dtype=torch.bool).tril(diagonal=m - t)
    module = type("M", (), {"sinks": sinks, "num_key_value_groups": hq // hk, "training": False})()
    additive = torch.zeros(t, m).masked_fill(~mask, float("-inf")).view(1, 1, t, m)
    out, weights = eager_attention_forward(module, q, k, v, additive, scaling=d ** -0.5)
    capture = AttentionCapture(AttentionNeed("all"))
    got = capture.attend(0, q, k, v, d ** -0.5, mask.view(1, 1, t, m), sinks)
    torch.testing.assert_close(got, out, atol=1e-5, rtol=0)
    want = weights.view(b, hk, hq // hk, t, m).sum(dim=3)
    torch.testing.assert_close(capture.by_layer[0], want, atol=1e-5, rtol=0)
    assert (weights.sum(-1) < 1).all()


def test_shared_steps_on_a_hybrid_equal_alone_and_share_while_every_window_is_as_the_full_cache_holds():
    """A group's cells replay the steps the full cache recorded while each layer holds what the full cache holds
    (its windowed layers their window, cut alike in every cell), then compute their own."""
    from kdeval.keydiff.step.shared import SharedSteps

    model = hybrid("gemma3_text")
    policies = ["keydiff", "snapkv", "tova", "pyramidkv"]
    store = SharedSteps([get_policy(p) for p in ["full", *policies]], max_tokens=2 * 48 + 16)
    prompt = ids(110)

    def generate(policy, shared):
        eng = Engine(model, get_policy(policy), EngineConfig(budget=None if policy == "full" else 48, chunk_size=16))
        with eng.sharing(shared):
            return eng.generate(prompt, max_new_tokens=3)

    generate("full", store)
    for policy in policies:
        got, ref = generate(policy, store), generate(policy, None)
        # chunks of 16, N = 48, a window of 40: the windowed layers are cut from the third chunk on, like the full
        # cache's, and the fourth (the first to evict a full layer) is the last replayed
        # chunks of 16, a window of 40: the windowed layers are cut from the third chunk on, as the full cache's
        # are, and sharing goes on to the first chunk that evicts a full layer (N = 48: the fourth), replayed too
        plan = Engine(model, get_policy(policy), EngineConfig(budget=48, chunk_size=16)).plan
        least = min(b for i, b in enumerate(plan.budgets) if not plan.trims(i))
        assert got.stats.replayed_steps == least // 16 + 1 >= 3 and ref.stats.replayed_steps == 0
        assert got.tokens == ref.tokens
        assert got.stats.peak_kv_bytes == ref.stats.peak_kv_bytes
        for a, b in zip(got.state.cache.layers, ref.state.cache.layers):
            assert torch.equal(a.view()[1], b.view()[1]) and torch.equal(a.view()[0], b.view()[0])


def test_a_quantized_store_on_a_hybrid_keeps_the_window_and_the_budget():
    from kdeval.keydiff.quant.rule import KVQuant

    model = hybrid("gemma3_text")
    kinds = layer_kinds(model.config)
    eng = Engine(model, get_policy("keydiff"), EngineConfig(budget=36, chunk_size=16,
                                                            kv_quant=KVQuant(bits=4, group_size=16, window=16)))
    res = eng.generate(ids(150), max_new_tokens=3)
    for kind, layer in zip(kinds, res.state.cache.layers):
        assert layer.length == (kind.most_kept() if kind.windowed else 36)
    plain = Engine(model, get_policy("keydiff"), EngineConfig(budget=36, chunk_size=16)).generate(ids(150), 3)
    assert res.stats.peak_kv_bytes < plain.stats.peak_kv_bytes  # the record's packed codes count, not full width
