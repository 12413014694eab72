"""Checkpoints as they are saved: Qwen3.5, Gemma 3 and Mistral 3 ship as multimodal wrapper configs (a
``text_config`` beside a vision tower). Loaded by path, each runs its text decoder on text: chunked without
eviction equals one pass, and KeyDiff keeps N in the full-attention layers the text config names."""
import pytest
import torch
from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Mistral3Config,
                          Mistral3ForConditionalGeneration, Qwen3_5Config, Qwen3_5ForConditionalGeneration)

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import UnsupportedModelError, load_model
from kdeval.zoo.byte_tokenizer import byte_level_tokenizer
from kdeval.zoo.config_check import ModelConfigError
from kdeval.zoo.families import family

N, B, L = 32, 16, 120
_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
            patch_size=16)


def _text(key: str, **extra) -> dict:
    kw = family(key).kwargs()
    kw.pop("model_type")
    return {**kw, "vocab_size": len(byte_level_tokenizer()), **extra}


WRAPPERS = {
    "qwen3_5": lambda: (Qwen3_5ForConditionalGeneration, Qwen3_5Config(
        text_config=_text("qwen3.5"), vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                         out_hidden_size=64))),
    "gemma3": lambda: (Gemma3ForConditionalGeneration, Gemma3Config(
        text_config=_text("gemma3"), vision_config=_VIT, mm_tokens_per_image=4)),
    "mistral3": lambda: (Mistral3ForConditionalGeneration, Mistral3Config(
        text_config=_text("mistral", model_type="mistral"), vision_config=dict(_VIT, head_dim=16))),
}


def _saved(tmp_path, kind: str):
    cls, config = WRAPPERS[kind]()
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path / kind)
    byte_level_tokenizer().save_pretrained(tmp_path / kind)
    return str(tmp_path / kind)


@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_a_wrapper_checkpoint_runs_its_text_decoder(tmp_path, kind):
    lm = load_model(_saved(tmp_path, kind), device="cpu")
    ids = torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(0))
    one = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=L)).prefill(ids).last_logits
    chunked = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=B)).prefill(ids).last_logits
    assert torch.allclose(one, chunked, atol=1e-5)
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B))
    res = eng.generate(ids, max_new_tokens=3)
    full = [i for i in range(eng.plan.num_layers) if eng.plan.kind(i).evicted]
    assert full and all(res.state.cache.layers[i].length == N for i in full)
    assert lm.max_context == lm.model.config.get_text_config(decoder=True).max_position_embeddings


def test_a_wrapper_whose_decoder_is_refused_names_the_decoder(tmp_path):
    """The reason is the decoder's own (a layer type the engine does not run), not "no num_attention_heads"."""
    cls, config = WRAPPERS["qwen3_5"]()
    config.text_config.layer_types = ["linear_attention", "deepseek_sparse_attention", "full_attention"]
    config.save_pretrained(tmp_path / "w")
    with pytest.raises((UnsupportedModelError, ModelConfigError),
                       match=r"text_config.layer_types: its sparse-attention layers \(deepseek_sparse_attention\)"):
        load_model(str(tmp_path / "w"), device="cpu")
