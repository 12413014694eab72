"""Opening the index from a command: read-only commands never create a missing SQLite file."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from kdeval.cli.errors import EXIT_BAD_INPUT
from kdeval.storage import DEFAULT_DB_PATH, RunIndex, db_url, sqlite_path

DB_HELP = f"Index database: a path or a SQLAlchemy URL (default {DEFAULT_DB_PATH})."

err = Console(stderr=True)


def missing_index(db: Optional[str]) -> Optional[Path]:
    """The SQLite file ``db`` names if it does not exist yet; None when it exists (or is not SQLite)."""
    path = sqlite_path(db_url(db, make_dirs=False))
    return path if path is not None and not path.is_file() else None


def open_index(db: Optional[str], *, must_exist: bool = True) -> RunIndex:
    """Open the index; with ``must_exist`` a missing SQLite file is bad input (exit 2), not a new empty index."""
    missing = missing_index(db) if must_exist else None
    if missing is not None:
        err.print(f"no index at {missing} (nothing submitted yet?); pass --db to use another one",
                  markup=False, highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    return RunIndex.open(db)
