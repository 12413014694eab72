"""Text in figures shown as given: names from users (a model path, an imported press name such as
``$\\frac{1}{$``) are never read as matplotlib mathtext or TeX, which would end a report or a leaderboard page
in a parse error (one bad name broke every page).

:func:`literal_text` runs a function that builds or draws a figure with ``text.parse_math`` and
``text.usetex`` off; every ``Text`` matplotlib makes meanwhile (titles, labels, legends, and the tick labels
made when the figure is drawn) keeps that setting, and nothing outside the call changes
(``matplotlib.rc_context``).
"""
from __future__ import annotations

import functools
from typing import Callable, TypeVar

T = TypeVar("T")

#: matplotlib's settings under which a string is drawn as its characters
LITERAL = {"text.parse_math": False, "text.usetex": False}


def literal_text(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run under :data:`LITERAL` (decorate every function that makes a figure's text or draws it)."""
    @functools.wraps(fn)
    def run(*args, **kwargs) -> T:
        import matplotlib  # here: the modules that decorate their figures are imported for terminal views too

        with matplotlib.rc_context(LITERAL):
            return fn(*args, **kwargs)
    return run
