"""Exit codes shared by every command: 0 done, 1 some cells failed, 2 bad input."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import typer

from kdeval.shown import shown

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


@contextlib.contextmanager
def bad_input() -> Iterator[None]:
    """Turn ``ValueError``/``FileNotFoundError`` into a one-line message on stderr and exit code 2 (control, bidi
    and invisible characters in it, from a run id or a path the user typed, written as escapes)."""
    try:
        yield
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {shown(exc)}", file=sys.stderr)
        raise typer.Exit(EXIT_BAD_INPUT) from None
