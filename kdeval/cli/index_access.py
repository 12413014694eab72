"""Where a command reads and writes: opening the index and checking the results directory.

Bad places fail fast, before a run is created: one line naming the flag and the cause, exit 2. Read-only
commands never create a missing SQLite file and read an index they cannot write; commands that write refuse
one they cannot write.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn, Optional

import typer

from kdeval.cli.consoles import stderr
from kdeval.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED
from kdeval.storage import (
    DB_ENV, DEFAULT_DB_PATH, IndexAccessError, IndexLockedError, RunIndex, db_url, sqlite_path,
)

DB_HELP = (f"Index database: a path, a SQLAlchemy URL, or @FILE holding one (keeps a password out of `ps`) "
           f"(default ${DB_ENV}, else {DEFAULT_DB_PATH}).")


def _fail(message: str) -> NoReturn:
    """One unwrapped line on stderr, exit 2."""
    stderr().print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def missing_index(db: Optional[str]) -> Optional[Path]:
    """The SQLite file ``db`` names if it does not exist yet; None when it exists (or is not SQLite). An
    ``@FILE`` that cannot be read exits 2."""
    try:
        path = sqlite_path(db_url(db, make_dirs=False))
    except IndexAccessError as e:
        _fail(f"error: --db: {e}")
    return path if path is not None and not path.is_file() else None


def open_index(db: Optional[str], *, must_exist: bool = True, write: bool = True) -> RunIndex:
    """Open the index; with ``must_exist`` a missing SQLite file is bad input (exit 2), not a new empty index.

    ``write=False`` for commands that only read (``status``, ``ls``, ``report``): a SQLite index this user
    cannot write is opened read-only. An unusable ``--db`` (not an index, unreachable, read-only for a
    command that writes) exits 2 with ``error: --db: <place> <cause>``; a SQLite index another process holds
    locked is waited for, said in one line, and after the busy timeout is one line and exit 1."""
    missing = missing_index(db) if must_exist else None
    if missing is not None:
        _fail(f"no index at {missing} (nothing submitted yet?); pass --db to use another one")
    def waiting(line: str) -> None:
        stderr().print(line, markup=False, highlight=False, soft_wrap=True)

    try:
        return RunIndex.open(db, write=write, on_wait=waiting)
    except IndexLockedError as e:  # not bad input: the same command can run once the lock is free
        stderr().print(f"error: --db: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    except IndexAccessError as e:
        _fail(f"error: --db: {e}")


def results_dir_problem(results_dir: Path) -> Optional[str]:
    """Why per-cell files cannot be written under ``results_dir`` (None when they can): it, or the nearest
    of its parents that exists (the driver creates the rest), must be a writable directory. Writes nothing."""
    target = Path(results_dir).expanduser().absolute()
    probe = target
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    why = "is not a directory" if not probe.is_dir() else None
    if why is None and not os.access(probe, os.W_OK | os.X_OK):
        why = "is not writable"
    if why is None:
        return None
    return f"{probe} {why}" if probe == target else f"cannot create {target}: {probe} {why}"


def check_results_dir(results_dir: Path) -> None:
    """Exit 2 with ``error: --results-dir: <cause>`` when ``results_dir`` cannot receive result files."""
    problem = results_dir_problem(results_dir)
    if problem is not None:
        _fail(f"error: --results-dir: {problem}")
