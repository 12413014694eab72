"""Grid validation errors: each names the field path and the expected form."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from kdeval.shown import shown

#: One problem's line is cut to about this many characters.
MAX_ISSUE_CHARS = 600


@dataclass(frozen=True)
class GridIssue:
    """One problem in a grid file, e.g. ``GridIssue("policies[2].params.window", "must be > 0")``; its line
    writes control, bidi and invisible characters as escapes (:func:`kdeval.shown.shown`)."""

    path: str
    message: str

    def __str__(self) -> str:
        # a key or value echoed back is shown, not obeyed: ESC, bidi and invisible characters as escapes
        text = shown(f"{self.path}: {self.message}" if self.path else self.message)
        if len(text) <= MAX_ISSUE_CHARS:
            return text
        # a huge value echoed back (an unknown name, key, ...): its start and the end, where the expected form is
        head, tail = MAX_ISSUE_CHARS * 2 // 3, MAX_ISSUE_CHARS // 3
        return f"{text[:head]} …({len(text) - head - tail} characters cut)… {text[-tail:]}"


class GridError(ValueError):
    """A grid file is invalid; ``issues`` lists every problem found."""

    def __init__(self, issues: Iterable[GridIssue], source: str | None = None) -> None:
        self.issues = list(issues)
        self.source = source
        super().__init__(format_grid_error(self))

    def with_source(self, source: str) -> "GridError":
        """This error naming ``source`` (the grid file) when it names none yet."""
        return self if self.source else GridError(self.issues, source)


def join_path(parts: Iterable[str | int]) -> str:
    """``("policies", 2, "params", "window")`` -> ``policies[2].params.window``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def format_grid_error(err: GridError) -> str:
    """Human-readable text for the CLI: a header and one line per issue."""
    where = f" in {err.source}" if err.source else ""
    n = len(err.issues)
    lines = [f"invalid grid{where}: {n} problem{'s' if n != 1 else ''}"]
    lines += [f"  {issue}" for issue in err.issues]
    return "\n".join(lines)
