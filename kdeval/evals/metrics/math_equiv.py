"""Math answers: the last ``\\boxed{...}`` of a text and a math-equivalence check.

Equivalence: equal after light LaTeX normalization, or equal by ``math-verify`` (LaTeX parsed to
sympy; numeric and symbolic comparison, sets/intervals/matrices, units and ``\\text`` stripped).
"""
from __future__ import annotations

import re
import threading
import warnings

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed x``) with balanced braces."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if i < len(text) and text[i] == " ":  # "\boxed 5": up to the next "$" or whitespace
        m = re.match(r" +([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "\\":  # skip escaped braces like \{ and \}
            continue
        if ch == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif ch == "}" and (j == 0 or text[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[i + 1: j]
    return None  # unbalanced


_SPACING = re.compile(r"\\[,;:! ]|\\left|\\right|\\displaystyle")


def normalize_latex(s: str) -> str:
    """Light normalization for string comparison: spacing commands, dfrac/tfrac, ^\\circ, ``$``, spaces."""
    s = s.strip().strip("$").strip()
    s = _SPACING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("^\\circ", "").replace("^{\\circ}", "")
    s = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", r"\1", s)
    s = s.replace(" ", "").rstrip(".")
    return s


def _timeout() -> int | None:
    """math-verify's timeouts use SIGALRM, which only the main thread may set."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse(expr: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(f"${expr}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=_timeout())


def math_equal(prediction: str | None, gold: str, string_match: bool = True) -> bool:
    """True when the answer ``prediction`` equals ``gold`` (both LaTeX answers, no ``\\boxed``).

    ``string_match=False`` skips the normalized-string shortcut (math-verify decides alone).
    """
    if prediction is None:
        return False
    if string_match and normalize_latex(prediction) == normalize_latex(gold):
        return True
    from math_verify import verify

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g, p = _parse(gold), _parse(prediction)
            if not g or not p:
                return False
            return bool(verify(g, p, timeout_seconds=_timeout()))
        except Exception:  # noqa: BLE001 - an unparsable answer is not equal
            return False
