"""Names shared by every layer: close-name suggestions for unknown names ("did you mean …?") in error messages,
and the prefix that marks a random-weight model id (``random:tiny-llama``)."""
from __future__ import annotations

import difflib
from typing import Iterable

#: Model ids with this prefix name a random-weight model built locally (no weights to load).
RANDOM_PREFIX = "random:"


def close_matches(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    """The ``n`` choices closest to ``word`` (difflib ratio ≥ ``cutoff``), best first."""
    return difflib.get_close_matches(str(word), list(choices), n=n, cutoff=cutoff)


def suggest(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> str:
    """``"; did you mean 'a' or 'b'?"`` for the closest choices, or an empty string."""
    close = close_matches(word, choices, n, cutoff)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
