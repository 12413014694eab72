"""Text from users as a terminal may show it: control characters (ESC, BEL, NUL, C1 codes), bidi overrides and
isolates (U+202E, U+2066..U+2069) and invisible characters (U+200B, U+FEFF) written as escapes (``\\x1b``,
``\\u202e``), so that a grid key, a run id or a run name can neither drive the terminal nor hide or reorder
what is printed around it. A leaf helper any layer may import."""
from __future__ import annotations

import unicodedata

#: Unicode categories written as escapes: controls (Cc), format characters (Cf: bidi, zero-width, BOM),
#: line and paragraph separators (Zl, Zp), unassigned and private code points are left as they are.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def hidden(ch: str) -> bool:
    """Whether ``ch`` would act on the terminal or be invisible there rather than show as itself."""
    return unicodedata.category(ch) in HIDDEN_CATEGORIES


def escaped(ch: str) -> str:
    """``ch`` as a Python escape: ``\\x1b``, ``\\u202e``, ``\\U000e0001``."""
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def shown(text: object) -> str:
    """``str(text)`` with every hidden character (:func:`hidden`) written as its escape; other text unchanged."""
    s = str(text)
    if s.isprintable():  # the common case: nothing to replace (isprintable is False for every hidden character)
        return s
    return "".join(escaped(c) if hidden(c) else c for c in s)


def first_hidden(text: str) -> str | None:
    """The first hidden character of ``text`` as its escape (``'\\u202e'``), or None."""
    return next((escaped(c) for c in text if hidden(c)), None)
