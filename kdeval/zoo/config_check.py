"""A local model directory read as untrusted input at submit, before any weight loads: its ``config.json``,
its tokenizer files and its safetensors headers (:mod:`kdeval.untrusted` reads them: regular files only,
bounded in size and nesting).

:func:`check_config` checks every field the engine reads (sizes, layers, heads, windows, latent widths) for
type and range, heads that divide, finite numbers anywhere, a ``model_type`` of a family kdeval runs (or the
reason it does not), and no custom code: a config whose ``auto_map`` names code of its own and whose
``model_type`` transformers does not ship is refused (kdeval never passes ``trust_remote_code=True``). Each
refusal is one
:class:`ModelConfigError` line naming the file and the field (``m/config.json: num_attention_heads: expected a
positive integer (at most 1024), got 0``).

Pure data and the standard library: grids are validated without transformers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kdeval.names import suggest
from kdeval import untrusted
from kdeval.untrusted import UntrustedFileError, load_json, non_finite
from kdeval.zoo.families import FAMILIES

#: The largest ``config.json`` (or small tokenizer JSON file) read: real ones are a few kB.
MAX_CONFIG_BYTES = 4 << 20
#: The largest tokenizer vocabulary file accepted (``tokenizer.json`` of a 256K vocabulary is about 35 MB).
MAX_TOKENIZER_BYTES = 256 << 20
#: The largest safetensors header read (the format's own limit is 100 MB).
MAX_SAFETENSORS_HEADER = 100 << 20
# : The most layers a config may name: far beyond any released model, so ``num_hidden_layers: 1e12`` builds no
# list.
MAX_LAYERS = 1024
#: The most attention heads (query or KV) a config may name.
MAX_HEADS = 1024
_WIDTH, _CONTEXT = 1 << 20, (1 << 31) - 1

#: field: (least, most, null accepted): the integers the engine and transformers build the model from
INT_FIELDS: dict[str, tuple[int, int, bool]] = {
    "hidden_size": (1, _WIDTH, False),
    "intermediate_size": (1, _WIDTH, True),
    "num_hidden_layers": (1, MAX_LAYERS, False),
    "num_attention_heads": (1, MAX_HEADS, False),
    "num_key_value_heads": (1, MAX_HEADS, True),
    "head_dim": (1, 1 << 16, True),
    "max_position_embeddings": (1, _CONTEXT, False),
    "vocab_size": (1, 1 << 24, False),
    "sliding_window": (1, _CONTEXT, True),
    "attention_chunk_size": (1, _CONTEXT, True),
    "max_window_layers": (0, MAX_LAYERS, True),
    "num_kv_shared_layers": (0, MAX_LAYERS, True),
    "kv_lora_rank": (1, 1 << 16, True),
    "q_lora_rank": (1, 1 << 16, True),
    "qk_rope_head_dim": (1, 1 << 16, True),
    "qk_nope_head_dim": (1, 1 << 16, True),
    "v_head_dim": (1, 1 << 16, True),
    "num_experts": (1, 1 << 16, True),
    "num_local_experts": (1, 1 << 16, True),
    "num_experts_per_tok": (1, 1 << 16, True),
}
#: positive finite numbers where given
POSITIVE_FIELDS = ("rope_theta", "rms_norm_eps", "layer_norm_eps")
BOOL_FIELDS = ("use_sliding_window", "tie_word_embeddings", "is_encoder_decoder", "attention_bias")

# : Architectures whose cache is not a per-layer cache of attention keys, and why (also refused when a model
# loads: : :func:`kdeval.zoo.loading.check_supported`).
UNSUPPORTED_TYPES = {
    "mamba": "a state-space model has no KV cache",
    "mamba2": "a state-space model has no KV cache",
    "falcon_mamba": "a state-space model has no KV cache",
    "rwkv": "a recurrent model has no KV cache",
    "recurrent_gemma": "hybrid recurrent layers have no KV cache",
    "minimax": "its lightning-attention layers keep their state in a cache class of its own (MiniMaxCache), which "
               "the engine's cache cannot stand in for",
    # FalconAttention computes attention in its own code (its own SDPA call, or eager code that adds the mask
    # to the scores), never through transformers' attention interface: the engine's masks and attention rows
    # never reach it
    "falcon": "its attention never runs through transformers' attention interface, so the engine can neither "
              "mask a batch's rows nor read attention",
}
# : The ``model_type`` values of the families the engine is proven on (kdeval/zoo/families.py), less the
# refused.
KNOWN_TYPES = frozenset(f.model_type for f in FAMILIES) - set(UNSUPPORTED_TYPES)
#: sizes a config may give per layer, as a list (Gemma 3n's MLP widths)
PER_LAYER_FIELDS = frozenset({"intermediate_size"})
#: multimodal wrapper configs whose ``text_config`` is the decoder (checkpoints saved as they ship: Qwen3.5, Gemma 3,
#: 3n and 4, Mistral 3); their text decoder is checked as a config of its own
WRAPPER_TYPES = frozenset({"qwen3_5", "qwen3_5_moe", "gemma3", "gemma3n", "gemma4", "mistral3"})

#: Tokenizer files transformers may read from a model directory: small JSON ones (parsed here) and the rest.
TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                  "added_tokens.json")
TOKENIZER_OTHER = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")


class ModelConfigError(UntrustedFileError):
    """A model's files refused at submit; the message is one line naming the file and the field."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}… ({len(text)} characters)"


def _int_problem(value: Any, least: int, most: int, null: bool) -> str | None:
    if value is None and null:
        return None
    kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
    if type(value) is not int or not least <= value <= most:
        return f"expected {kind} (at most {most}){' or null' if null else ''}, got {_shown(value)}"
    return None


def _custom_code(auto_map: Any) -> str:
    """The files an ``auto_map`` names (``configuration_evil.py``), for the message."""
    refs = [r for v in (auto_map.values() if isinstance(auto_map, dict) else [])  # a class, or [slow, fast]
            for r in (v if isinstance(v, list) else [v])]
    files = sorted({f"{r.split('--')[-1].split('.')[0]}.py" for r in refs if isinstance(r, str)})
    return ", ".join(files[:3]) or "its own code"


def _type_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """(field, message) when the config names custom code, no model type, or one kdeval does not run."""
    model_type = config.get("model_type")
    if "auto_map" in config and model_type not in KNOWN_TYPES:
        return "auto_map", (f"the model needs code of its own ({_custom_code(config['auto_map'])}), which "
                            "kdeval never runs (trust_remote_code stays off); use a model whose architecture "
                            "transformers ships (`kdeval models` lists the families)")
    if not isinstance(model_type, str):
        return "model_type", ("expected the name of a model family (llama, qwen2, ...), got "
                              f"{_shown(model_type)}")
    if model_type in UNSUPPORTED_TYPES:
        return "model_type", f"'{model_type}' is not supported: {UNSUPPORTED_TYPES[model_type]}"
    if model_type not in KNOWN_TYPES:
        return "model_type", (f"'{_shown(model_type)[1:-1]}' is not a family kdeval runs"
                              f"{suggest(model_type, KNOWN_TYPES)}; `kdeval models` lists them")
    return None


def _problem(config: Any) -> tuple[str, str] | None:
    """(field, message) of the first thing wrong with ``config`` (a parsed ``config.json``), or None; a
    multimodal wrapper's: its own type and code, then its text decoder's (fields named ``text_config.*``)."""
    if not isinstance(config, dict):
        return "", f"expected a JSON object (a transformers config), got a JSON {type(config).__name__}"
    bad = non_finite(config)
    if bad is not None:
        return bad[0], f"expected a finite number, got {bad[1]}"
    if config.get("model_type") in WRAPPER_TYPES and isinstance(config.get("text_config"), dict):
        if "auto_map" in config:
            return "auto_map", (f"the model needs code of its own ({_custom_code(config['auto_map'])}), which "
                                "kdeval never runs (trust_remote_code stays off)")
        found = _problem(config["text_config"])
        return (f"text_config.{found[0]}".rstrip("."), found[1]) if found is not None else None
    found = _type_problem(config)
    if found is not None:
        return found
    for name, (least, most, null) in INT_FIELDS.items():
        if name in config:
            value = config[name]
            if name in PER_LAYER_FIELDS and isinstance(value, list) and value:  # one per layer (Gemma 3n)
                value = next((v for v in value if _int_problem(v, least, most, False)), value[0])
            why = _int_problem(value, least, most, null)
            if why is not None:
                return name, why
    for name in POSITIVE_FIELDS:
        value = config.get(name)
        if name in config and (type(value) not in (int, float) or value <= 0):
            return name, f"expected a positive number, got {_shown(value)}"
    for name in BOOL_FIELDS:
        if name in config and not isinstance(config[name], bool):
            return name, f"expected true or false, got {_shown(config[name])}"
    if config.get("is_encoder_decoder"):
        return "is_encoder_decoder", "encoder-decoder models are not supported (decoder-only causal LMs only)"
    return _shape_problem(config)


def _shape_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """Heads that do not divide, a head width that does not follow from the hidden size, layer types that are
    not one per layer or not attention layers."""
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        return "num_key_value_heads", f"expected a divisor of num_attention_heads {heads}, got {kv}"
    hidden = config.get("hidden_size")
    derived = config.get("head_dim") is None and isinstance(hidden, int) and isinstance(heads, int)
    if derived and hidden % heads:
        return "hidden_size", (f"expected a multiple of num_attention_heads {heads} (head_dim is not given), "
                               f"got {hidden}")
    types = config.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        return "layer_types", f"expected a list of layer type names, got {_shown(types)}"
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and len(types) != layers:
        return "layer_types", f"expected one entry per layer (num_hidden_layers {layers}), got {len(types)}"
    from kdeval.keydiff.attention.layer_kinds import unknown_layer_types  # torch: paid by grid checks already

    unknown = unknown_layer_types(type("Config", (), {"layer_types": types}))
    indexed = [t for t in unknown if t.endswith("sparse_attention")]
    if indexed:
        return "layer_types", (f"its sparse-attention layers ({', '.join(indexed)}) cache an indexer key per token "
                               "beside the keys and values, which the engine does not yet evict in step with them")
    if unknown:
        return "layer_types", (f"{_shown(unknown)} are not layers the engine runs (full, sliding-window or chunked "
                               "attention, linear-attention, Mamba or conv layers)")
    return None


def check_config(config: Any, source: str) -> dict[str, Any]:
    """``config`` (a parsed ``config.json``) when the engine can build a model from it;
    :class:`ModelConfigError` naming ``source`` and the field otherwise."""
    found = _problem(config)
    if found is not None:
        field, why = found
        raise ModelConfigError(f"{source}: {field}: {why}" if field else f"{source}: {why}")
    return config


def read_config(path: Path, source: str | None = None) -> dict[str, Any]:
    """The checked config of ``path`` (:func:`check_config`); ``source`` names it in messages (default:
    the path)."""
    try:
        value = load_json(path, MAX_CONFIG_BYTES)
    except UntrustedFileError as e:
        raise ModelConfigError(str(e)) from None
    return check_config(value, source or str(path))


def read_head(path: Path, max_bytes: int, head: int | None = None) -> tuple[bytes, int]:
    """:func:`kdeval.untrusted.read_head`, its refusal a :class:`ModelConfigError`."""
    try:
        return untrusted.read_head(path, max_bytes, head)
    except UntrustedFileError as e:
        raise ModelConfigError(str(e)) from None


def check_tokenizer_files(directory: Path) -> None:
    """The tokenizer files of a model directory: regular files of bounded size, the small JSON ones parsed
    with bounded nesting, no custom tokenizer code (``auto_map``) and no NaN."""
    for name in TOKENIZER_JSON + TOKENIZER_OTHER:
        path = directory / name
        if not (path.exists() or path.is_symlink()):
            continue
        if name not in TOKENIZER_JSON:
            read_head(path, MAX_TOKENIZER_BYTES, 0)
            continue
        try:
            value = load_json(path, MAX_CONFIG_BYTES)
        except UntrustedFileError as e:
            raise ModelConfigError(str(e)) from None
        if not isinstance(value, dict):
            raise ModelConfigError(f"{path} is not a JSON object: got a JSON {type(value).__name__}")
        if "auto_map" in value:
            raise ModelConfigError(f"{path}: auto_map: the tokenizer needs code of its own "
                                   f"({_custom_code(value['auto_map'])}), which kdeval never runs "
                                   "(trust_remote_code stays off)")
        bad = non_finite(value)
        if bad is not None:
            raise ModelConfigError(f"{path}: {bad[0]}: expected a finite number, got {bad[1]}")


def _safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot load (truncated, a header not the format's), or None."""
    import json
    import struct

    head, size = read_head(path, 1 << 50, 8)
    if len(head) < 8:
        return f"is {size} bytes: not a safetensors file (no header)"
    (n,) = struct.unpack("<Q", head)
    if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
        return f"is {size} bytes with a header of {n}: truncated, or not a safetensors file"
    header, _ = read_head(path, 1 << 50, 8 + n)
    try:
        entries = json.loads(header[8:].decode("utf-8"))
        end = max([e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__"], default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return "has a header that is not safetensors' JSON"
    if not isinstance(end, int) or 8 + n + end > size:
        return f"is {size} bytes, but its header describes {8 + n + end}: truncated"
    return None


def check_weights(directory: Path) -> None:
    """The weights of a model directory are there and whole: ``model.safetensors`` (or every shard its index
    names) holds the bytes its header describes; a directory without weights is refused."""
    index = directory / "model.safetensors.index.json"
    if index.exists() or index.is_symlink():
        try:
            value = load_json(index, MAX_CONFIG_BYTES * 16)
        except UntrustedFileError as e:
            raise ModelConfigError(str(e)) from None
        shards = value.get("weight_map") if isinstance(value, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(s, str) for s in shards.values()):
            raise ModelConfigError(f"{index}: weight_map: expected a mapping of tensor names to shard files")
        files = sorted(set(shards.values()))
        bad = next((f for f in files if "/" in f or "\\" in f or f in ("", ".", "..")), None)
        if bad is not None:
            raise ModelConfigError(f"{index}: weight_map: expected shard file names in the model directory, "
                                   f"got {_shown(bad)}")
    elif (directory / "model.safetensors").exists():
        files = ["model.safetensors"]
    elif any((directory / name).exists() for name in WEIGHTS):
        return  # PyTorch weights: transformers reads them with weights_only
    else:
        raise ModelConfigError(f"{directory} holds no weights; expected model.safetensors (or its index) "
                               "beside config.json, as save_pretrained writes them")
    for name in files:
        path = directory / name
        if not path.exists():
            raise ModelConfigError(f"{path} is missing (named by model.safetensors.index.json)")
        why = _safetensors_problem(path)
        if why is not None:
            raise ModelConfigError(f"{path} {why}")


def check_model_directory(directory: Path) -> None:
    """Everything :mod:`kdeval.zoo.config_check` checks of a model directory (config, tokenizer files,
    weights), raising the first :class:`ModelConfigError`."""
    read_config(directory / "config.json")
    check_tokenizer_files(directory)
    check_weights(directory)
