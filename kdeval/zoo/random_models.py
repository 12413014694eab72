"""The tiny random models' shapes (``random:<kind>``), apart from their loading (kdeval/zoo/loading.py), so that
a grid naming one is validated without importing transformers.

Every decoder family of the family table (kdeval/zoo/families.py) is one: ``random:<key>-tiny``. The suite's
own two are its Llama and Qwen2 rows: ``random:llama-tiny`` (8 query heads over 2 KV heads: GQA 4:1) and
``random:qwen2-tiny`` (q/k/v biases; 4 query heads over 2 KV heads: GQA 2:1)."""
from __future__ import annotations

from typing import Any

from kdeval.zoo.families import FAMILIES
from kdeval.names import RANDOM_PREFIX

RANDOM_CONFIGS: dict[str, dict[str, Any]] = {f.random_kind: f.kwargs() for f in FAMILIES}


def random_model_names() -> list[str]:
    return [RANDOM_PREFIX + k for k in RANDOM_CONFIGS]
