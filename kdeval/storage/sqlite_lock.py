"""A SQLite index's file checked before it is trusted: waiting for one another process holds locked (a ``BEGIN
EXCLUSIVE`` of a tool, a writer that hangs): before a writer starts, the lock is probed in a moment; when it
is held, the caller is told so in one line (``on_wait``) and the writer waits up to the busy timeout for it,
then gives up with :class:`IndexLockedError`, one line naming the index, having written nothing.
:func:`sqlite_problem` says whether the file is still an intact index (a run's driver asks it before it
reports success: the file may have been truncated or replaced while the run held it open).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import quote

#: How long the first probe waits before the caller is told that the index is locked (seconds).
PROBE_S = 0.5


class IndexLockedError(RuntimeError):
    """The index stayed locked by another process for the whole busy timeout; nothing was written."""


def _locked(e: sqlite3.OperationalError) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


def _try_write_lock(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")


def wait_for_write_lock(path: Path, where: str, timeout_s: float,
                        on_wait: Optional[Callable[[str], None]] = None) -> None:
    """Return once a writer could take ``path``'s write lock (taken and released at once: nothing is written);
    ``on_wait`` gets one line when it must wait; :class:`IndexLockedError` when the lock stays held for
    ``timeout_s``. Other errors are left to the index's own opening (which names them)."""
    if not path.is_file():
        return
    try:
        conn = sqlite3.connect(str(path), timeout=PROBE_S, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        try:
            _try_write_lock(conn)
            return
        except sqlite3.OperationalError as e:
            if not _locked(e):
                return
        if on_wait is not None:
            on_wait(f"the index at {where} is locked by another process; waiting up to {timeout_s:g} s "
                    "for it")
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        try:
            _try_write_lock(conn)
        except sqlite3.OperationalError as e:
            if not _locked(e):
                return
            raise IndexLockedError(f"the index at {where} stayed locked by another process for "
                                   f"{timeout_s:g} s; nothing was written: try again once it is "
                                   "free") from None
    finally:
        conn.close()


def sqlite_problem(path: Path) -> str | None:
    """Why the SQLite index file ``path`` cannot be trusted now (gone, emptied, failing SQLite's own
    ``quick_check``), read through a fresh read-only connection (not a pool's cached pages), else None."""
    if not path.is_file():
        return "its file is gone"
    if path.stat().st_size == 0:
        return "its file was emptied"
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=PROBE_S * 20)
        try:
            found = [r[0] for r in conn.execute("PRAGMA quick_check(1)")]
            if found != ["ok"]:
                return f"SQLite's quick_check found it corrupt ({found[0] if found else 'no answer'})"
            if not conn.execute("SELECT name FROM sqlite_master WHERE name = 'runs'").fetchall():
                return "it no longer holds the runs table"
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return f"it cannot be read ({e})"
    return None
