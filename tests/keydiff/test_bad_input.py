"""Bad input gets a ValueError naming the parameter and the limit; unsupported models are refused up front."""
import pytest
from transformers import AutoConfig

from kdeval.baselines import UnknownPolicyError, get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import UnsupportedModelError, load_model
from kdeval.zoo.loading import check_supported

from .helpers import prompt, tiny


@pytest.mark.parametrize("kwargs,field", [
    ({"budget": 0}, "budget"), ({"budget": -5}, "budget"), ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": -1}, "chunk_size"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"cuda_graphs": "yes"}, "cuda_graphs"), ({"score_precision": "fp16"}, "score_precision"),
])
def test_engine_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        EngineConfig(**kwargs)


def test_budget_below_protected_tokens():
    with pytest.raises(ValueError, match=r"budget: must be >= the 10 tokens"):
        Engine(tiny().model, get_policy("keydiff", n_sink_tokens=10), EngineConfig(budget=5))


def test_prompt_longer_than_context():
    eng = Engine(tiny().model, get_policy("keydiff"), EngineConfig(budget=64))
    with pytest.raises(ValueError, match=r"prompt: 4100 tokens .* exceed the model's context of 4096"):
        eng.generate(prompt(4090), max_new_tokens=10)


def test_policy_parameters_validated():
    with pytest.raises(ValueError, match=r"window_fraction: must be in \[0, 1\)"):
        get_policy("keydiff", window_fraction=1.5)
    with pytest.raises(ValueError, match=r"anchor: expected one of"):
        get_policy("keydiff", anchor="median")
    with pytest.raises(ValueError, match=r"windw: unknown parameter for policy 'keydiff'"):
        get_policy("keydiff", windw=3)
    with pytest.raises(UnknownPolicyError, match=r"did you mean 'keydiff'"):
        get_policy("keydif")
    assert get_policy("keydiff", window_fraction="0.25").window_fraction == 0.25


def test_a_sliding_window_model_loads_with_its_windowed_layers():
    from kdeval.keydiff.attention.layer_kinds import layer_kinds

    lm = load_model("random:qwen2-tiny", overrides={"use_sliding_window": True, "sliding_window": 64,
                                                    "max_window_layers": 1})
    kinds = layer_kinds(lm.model.config)
    assert [k.label() for k in kinds] == ["full"] + ["sliding 64"] * (len(kinds) - 1)


@pytest.mark.parametrize("model_type,kwargs,reason", [
    ("mamba", {}, "no KV cache"),
    ("falcon", {}, "attention interface"),
    ("deepseek_v32", {"num_hidden_layers": 2}, r"sparse-attention layers \(deepseek_sparse_attention\) cache an "
                                               r"indexer key"),
    ("t5", {}, "encoder-decoder"),
])
def test_unsupported_architectures(model_type, kwargs, reason):
    config = AutoConfig.for_model(model_type, **kwargs)
    with pytest.raises(UnsupportedModelError, match=reason):
        check_supported(config, model_type)


def test_supported_architectures_pass():
    for model_type in ("llama", "qwen2"):
        check_supported(AutoConfig.for_model(model_type), model_type)
    check_supported(AutoConfig.for_model("mistral", sliding_window=None), "mistral")
    for model_type in ("mistral", "gemma2", "gemma3_text", "cohere2", "gpt_oss", "llama4_text",  # windowed layers
                       "deepseek_v2", "deepseek_v3",  # latent attention
                       "qwen3_next", "qwen3_5_text", "falcon_h1", "bamba"):  # recurrent layers beside attention
        check_supported(AutoConfig.for_model(model_type, num_hidden_layers=2), model_type)
