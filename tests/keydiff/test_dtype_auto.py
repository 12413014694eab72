"""``load_model(dtype="auto")``: the checkpoint's own precision on a GPU, float32 on a CPU."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from kdeval.zoo.loading import load_model, resolve_dtype


def _config(**kw):
    return AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, vocab_size=300, **kw)


@pytest.mark.parametrize("own, want", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                       (torch.bfloat16, torch.bfloat16), (None, torch.float32)])
def test_auto_is_the_configs_dtype_on_a_gpu(own, want):
    cfg = _config()
    cfg.dtype = own
    assert resolve_dtype("auto", cfg, "cuda") == want
    assert resolve_dtype("auto", cfg, "cuda:1") == want
    assert resolve_dtype("auto", cfg, "cpu") == torch.float32  # CPU: always float32


def test_named_dtypes_win_and_bad_names_are_refused():
    cfg = _config()
    cfg.dtype = "bfloat16"
    assert resolve_dtype("float16", cfg, "cpu") == torch.float16
    with pytest.raises(ValueError, match=r"^dtype: expected 'auto' or one of .*got 'fp8'"):
        resolve_dtype("fp8", cfg, "cpu")
    with pytest.raises(ValueError, match=r"^dtype: expected 'auto'"):
        load_model("random:llama-tiny", dtype="half", device="cpu")
    cfg.dtype = "float8_e4m3fn"
    with pytest.raises(ValueError, match=r"^dtype: auto: the model's config names float8_e4m3fn"):
        resolve_dtype("auto", cfg, "cuda")


def test_auto_loads_a_bfloat16_checkpoint_in_float32_on_cpu(tmp_path):
    """A checkpoint saved in bfloat16 (its config says so) loads in float32 on a CPU under ``auto``, and in
    its own dtype when asked by name."""
    lm = load_model("random:llama-tiny", dtype="bfloat16", device="cpu")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    assert str(AutoConfig.from_pretrained(tmp_path).dtype).removeprefix("torch.") == "bfloat16"
    auto = load_model(str(tmp_path), dtype="auto", device="cpu")
    assert auto.dtype == "float32" and next(auto.model.parameters()).dtype == torch.float32
    assert load_model(str(tmp_path), dtype="bfloat16", device="cpu").dtype == "bfloat16"
    assert load_model("random:llama-tiny", dtype="auto", device="cpu").dtype == "float32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_loads_the_checkpoints_dtype_on_cuda(tmp_path):
    lm = load_model("random:llama-tiny", dtype="bfloat16", device="cpu")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    auto = load_model(str(tmp_path), dtype="auto", device="cuda")
    assert auto.dtype == "bfloat16" and next(auto.model.parameters()).device.type == "cuda"
