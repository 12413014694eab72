"""Gemma's SentencePiece tokenizer rebuilt from a GGUF file's vocabulary, scores and token types.

A GGUF written from a SentencePiece model (``tokenizer.ggml.model == "llama"``) carries pieces with scores and
no BPE merges. transformers 5.17 turns such a file into a merge-less BPE (or, straight from the file, a
Unigram over BPE scores), which cuts text into single characters. Gemma's SentencePiece model is a BPE one:
encoding merges the adjacent pair whose joined piece scores highest, again and again. Merges ranked by the
joined piece's score give exactly that, and they are what transformers' own converter derives from a Gemma
``tokenizer.model`` (``convert_slow_tokenizer.GemmaConverter``: ``generate_merges`` over the pieces and
scores); this module feeds it the GGUF's pieces instead and builds transformers' ``GemmaTokenizer`` (spaces as
``▁``, no dummy prefix, byte fallback, BOS added).

Pieces SentencePiece matches whole before merging (its user-defined and control pieces: ``<start_of_turn>``,
``<end_of_turn>``, the ``<unused…>`` pieces, runs of newlines, tabs and spaces, a few HTML tags) become added
tokens that no merge builds; control pieces are special (skipped when generated text is decoded). The GGUF
writes runs of spaces with real spaces; they are ``▁`` runs again here, matched after the space-to-``▁``
normalizer.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import generate_merges
from transformers.integrations.gguf import read_gguf_metadata
from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

#: llama.cpp's token types (the same numbers as SentencePiece's piece types)
CONTROL, USER_DEFINED = 3, 4


def read_vocabulary(gguf: Path) -> dict:
    """The GGUF's ``tokenizer.*`` metadata (pieces, scores, token types, special ids), without any tensor."""
    meta, _ = read_gguf_metadata(str(gguf), ("tokenizer.ggml.tokens",))
    return {key: value for key, value in meta.items() if key.startswith("tokenizer.")}


def gemma_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """Gemma's SentencePiece BPE tokenizer from ``gguf``'s pieces and scores (seconds for 262K pieces)."""
    meta = read_vocabulary(gguf)
    if meta.get("tokenizer.ggml.model") != "llama" or "tokenizer.ggml.scores" not in meta:
        raise ValueError(f"{gguf.name}: expected a SentencePiece vocabulary with scores (tokenizer.ggml."
                         f"model 'llama'), got {meta.get('tokenizer.ggml.model')!r}")
    pieces = [_piece(token) for token in meta["tokenizer.ggml.tokens"]]
    scores, types = meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    if len(vocab) != len(pieces):
        raise ValueError(f"{gguf.name}: the vocabulary repeats a piece")
    whole = [i for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)]
    merges = generate_merges(vocab, list(zip(pieces, scores)), skip_tokens={pieces[i] for i in whole})

    def special(key: str) -> str:
        return pieces[meta[f"tokenizer.ggml.{key}_token_id"]]

    tokenizer = GemmaTokenizer(
        vocab=vocab, merges=merges, bos_token=special("bos"), eos_token=special("eos"),
        unk_token=special("unknown"), pad_token=special("padding"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
    # normalized: a run of spaces is matched once the normalizer has made it a run of '▁'
    tokenizer.add_tokens([AddedToken(pieces[i], normalized="▁" in pieces[i], special=types[i] == CONTROL)
                          for i in whole])
    return tokenizer


def _piece(token: str) -> str:
    """The SentencePiece spelling of a GGUF token: a run of spaces is a run of '▁'."""
    return "▁" * len(token) if token and not token.strip(" ") else token
