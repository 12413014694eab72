"""A byte-level tokenizer built in memory, for the tiny random test models (no files, no hub)."""
from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")


@lru_cache(maxsize=1)
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens plus ``<s>``, ``</s>``, ``<pad>``: every string round-trips, one token per byte."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.model_max_length = 4096
    return tok
