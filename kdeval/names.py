"""Names shared by every layer: close-name suggestions for unknown names ("did you mean …?") in error messages,
and the prefix that marks a random-weight model id (``random:tiny-llama``)."""
from __future__ import annotations

import difflib
from typing import Iterable

#: Model ids with this prefix name a random-weight model built locally (no weights to load).
RANDOM_PREFIX = "random:"


def suggest(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the choice closest to ``word`` (difflib ratio >= 0.6), or an empty string:
    the one "did you mean" of every error message (the engine's, the tasks' and the grid's, which can meet in
    one error list)."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
