"""Tokenizers that cut text into characters: refused when a model loads, warned about when a grid is
submitted.

A sub-word tokenizer whose conversion lost its merges (a BPE with none) or its scores (a Unigram whose pieces
all score alike) still encodes every string, one character a token, and a model runs on it without an error:
on prompts no user of the model sends, four times as long in tokens as their text. :func:`degenerate_reason`
reads the tokenizer's own model for that (a byte-level BPE of single symbols, as the tiny random models have,
is no such loss); :func:`chars_per_token` measures any tokenizer on a fixed English paragraph, where sub-word
tokenizers give about four characters a token and character-level ones one.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from kdeval.names import RANDOM_PREFIX

#: an English paragraph (ours) that every sub-word tokenizer cuts into words and pieces of words
PARAGRAPH = ("The committee met on a cold morning in early spring to discuss the new library. Several "
             "members argued that the building should open later in the evening, so that students and "
             "workers could use it after their classes and shifts. Others worried about the cost of "
             "heating and staff. After a long debate, they agreed to try the longer hours for six months "
             "and to count the visitors every week.")
#: below this many characters a token on :data:`PARAGRAPH` a tokenizer is taken for a character-level one
CHAR_LEVEL_BELOW = 1.5


class DegenerateTokenizerError(ValueError):
    """A model's tokenizer lost what makes it sub-word (its merges or its scores); the message says which."""


def degenerate_reason(tokenizer: Any) -> str | None:
    """Why ``tokenizer`` encodes one character a token although its vocabulary holds words, else None.

    Reads the fast tokenizer's model: a BPE with multi-symbol pieces in its vocabulary and no merge to reach
    them, or a Unigram whose pieces all have one score. Tokenizers without a ``tokenizers`` backend pass."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = json.loads(backend.to_str()).get("model", {})
    kind = model.get("type")
    if kind == "BPE" and not model.get("merges"):
        added = set(tokenizer.get_added_vocab())
        longer = sum(1 for piece in model.get("vocab", {}) if len(piece) > 1 and piece not in added
                     and not _is_byte_piece(piece))
        if longer:
            return (f"a BPE tokenizer with no merges: none of its {longer} multi-character pieces is ever "
                    "produced")
    if kind == "Unigram":
        scores = {score for _, score in model.get("vocab", [])}
        if len(scores) <= 1:
            return "a Unigram tokenizer whose pieces all have the same score (no scores)"
    return None


def refuse_degenerate(tokenizer: Any, name: str) -> None:
    """Raise :class:`DegenerateTokenizerError` naming ``name`` when :func:`degenerate_reason` gives one."""
    reason = degenerate_reason(tokenizer)
    if reason is not None:
        raise DegenerateTokenizerError(f"{name}: the tokenizer is {reason}; it would cut text into single "
                                       "characters, not the model's own tokens")


def chars_per_token(tokenizer: Any, text: str = PARAGRAPH) -> float:
    """Characters of ``text`` per token of it (special tokens left out)."""
    return len(text) / max(1, len(tokenizer.encode(text, add_special_tokens=False)))


def char_level_warning(tokenizer: Any, name: str) -> str | None:
    """One line saying that ``name``'s tokenizer looks character-level (:data:`CHAR_LEVEL_BELOW`), or None."""
    ratio = chars_per_token(tokenizer)
    if ratio >= CHAR_LEVEL_BELOW:
        return None
    return (f"model {name}: its tokenizer gives {ratio:.2f} characters a token on an English paragraph "
            "(sub-word tokenizers give about 4): it looks character-level, so prompts hold a fraction of the "
            "text their token lengths say")


#: the models warned about in this process: a grid is checked more than once on its way to a run
_warned: set[str] = set()


def warn_char_level(tokenizer: Any, name: str) -> None:
    """Write :func:`char_level_warning` to stderr once per model and process; the ``random:`` test models,
    whose byte-level tokenizer is character-level by design, are left alone."""
    if name.startswith(RANDOM_PREFIX) or name in _warned:
        return
    line = char_level_warning(tokenizer, name)
    if line is not None:
        _warned.add(name)
        print(f"warning: {line}", file=sys.stderr)


def _is_byte_piece(piece: str) -> bool:
    """``<0x41>``: a byte-fallback piece, one byte however it is spelt."""
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
