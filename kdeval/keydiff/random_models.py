"""The tiny random models' shapes (``random:<kind>``), apart from their loading (kdeval/keydiff/models.py), so that
a grid naming one is validated without importing transformers."""
from __future__ import annotations

from typing import Any

from kdeval.names import RANDOM_PREFIX

RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
    # 8 query heads over 2 KV heads: GQA 4:1.
    "llama-tiny": dict(
        model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
    ),
    # Qwen2 has q/k/v biases; 4 query heads over 2 KV heads: GQA 2:1.
    "qwen2-tiny": dict(
        model_type="qwen2", hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    ),
}


def random_model_names() -> list[str]:
    return [RANDOM_PREFIX + k for k in RANDOM_CONFIGS]
