"""Engine and session factory for the index: SQLite (WAL, busy timeout) by default, any SQLAlchemy URL.

Opening checks the place before anything is written: a file that is not an index, a database that cannot
be reached or has no driver, or an index that is read-only where the caller writes, raise
:class:`IndexAccessError` (a ``ValueError``) with one line naming the place and the cause. A reader
(``write=False``) opens a SQLite file it cannot write read-only (``mode=ro``), so ``status`` and reports
work on an archived index.
"""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, false, inspect, make_url, update
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kdeval.storage.migrate import add_missing_columns, missing_columns
from kdeval.storage.tables import Base, Run
from kdeval.storage.sqlite_lock import wait_for_write_lock

#: Default index location, relative to the working directory (``--db`` overrides it).
DEFAULT_DB_PATH = Path(".kdeval") / "index.sqlite"

#: The environment variable naming the index when ``--db`` is not given: a detached driver gets its URL this
#: way, so that a password in it is not in the process list.
DB_ENV = "KDEVAL_DB"

#: How long a SQLite connection waits for the writer's lock before raising (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000

#: How long connecting to a server database may take before the index counts as unreachable (seconds).
CONNECT_TIMEOUT_S = 10


class IndexAccessError(ValueError):
    """The index cannot be used as asked (not an index, unreachable, read-only for a writer); the message
    names the place and the cause in one line."""


class IndexStorageError(RuntimeError):
    """The index failed while in use: its disk is full, it became read-only, its server connection was lost.
    The message names the place and the cause in one line."""


#: Database messages that say the index's storage failed, not the statement: (text in the message, the cause).
_STORAGE_FAILURES = (
    ("database or disk is full", "its disk is full"), ("no space left on device", "its disk is full"),
    ("could not extend file", "its disk is full"), ("readonly database", "it became read-only"),
    ("read-only", "it became read-only"), ("disk i/o error", "a disk I/O error"),
    ("unable to open database file", "its file cannot be opened"),
    ("database is locked", f"another process held it locked for over {SQLITE_BUSY_TIMEOUT_MS // 1000} s"),
    ("database disk image is malformed", "its file is corrupt (truncated or overwritten)"),
    ("file is not a database", "its file is corrupt (truncated or overwritten)"),
    ("connection refused", "lost the connection to the database"),
    ("server closed the connection", "lost the connection to the database"),
    ("terminating connection", "lost the connection to the database"),
    ("connection to server", "lost the connection to the database"),
)


def _storage_errors(where: str, url: str = ""):
    """An engine ``handle_error`` hook turning a storage failure met while the index is in use into one
    :class:`IndexStorageError` (instead of a page of driver traceback)."""
    def handle(ctx) -> None:
        line = _scrub(_first_line(ctx.original_exception), url)
        low = line.lower()
        cause = "lost the connection to the database" if ctx.is_disconnect else next(
            (c for text, c in _STORAGE_FAILURES if text in low), None)
        if cause is not None:
            raise IndexStorageError(f"the index at {where} failed: {cause} ({line})") from ctx.original_exception
    return handle


def db_url(db: str | Path | None, *, make_dirs: bool = True) -> str:
    """Turn ``--db`` (a SQLAlchemy URL, a file path, ``@FILE``: the URL or path written in FILE, or None:
    ``$KDEVAL_DB``, else the default path) into a URL. ``@FILE`` and ``$KDEVAL_DB`` keep a password out of
    process lists; an unreadable FILE raises :class:`IndexAccessError`.

    With ``make_dirs`` the parent directory of a SQLite file is created."""
    text = db_text(db)
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def db_text(db: str | Path | None) -> str:
    """What ``--db`` names, as given: ``@FILE`` read, None as ``$KDEVAL_DB`` or the default path (see
    :func:`db_url`, which also makes a path absolute)."""
    if db is None:
        db = os.environ.get(DB_ENV) or DEFAULT_DB_PATH
    text = str(db)
    return _url_from_file(Path(text[1:]).expanduser()) if text.startswith("@") else text


def _url_from_file(path: Path) -> str:
    """The index URL (or path) written in ``path`` (its first line)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise IndexAccessError(f"cannot read the index URL from {path}: {getattr(e, 'strerror', None) or e}") from None
    if not lines or not lines[0].strip():
        raise IndexAccessError(f"{path} is empty; expected the index URL or path on its first line")
    return lines[0].strip()


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other databases or in-memory SQLite)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix):
        return Path(url[len(prefix):])
    return None


def sqlite_writable(path: Path) -> bool:
    """Whether this process can write the SQLite index ``path``: the file (or, when missing, its directory),
    and the directory SQLite keeps its ``-wal``/``-shm`` files in (unless both exist and are writable)."""
    folder = path.parent
    folder_ok = os.access(folder, os.W_OK | os.X_OK)
    if not path.exists():
        return folder_ok
    if not os.access(path, os.W_OK):
        return False
    side = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
    return folder_ok or all(os.access(p, os.W_OK) for p in side)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    """WAL lets readers (``kdeval status``) read while the driver writes (the busy timeout that waits
    for locks is set by ``make_engine``'s ``timeout`` connect argument)."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_read_only_pragmas(dbapi_conn, _record) -> None:
    """A read-only connection changes nothing, not even the journal mode."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA query_only=ON")
    cur.close()


def _postgres_utc(dbapi_conn, _record) -> None:
    """Sessions in UTC: ``timestamptz`` values come back in UTC, and an index made before the columns were
    ``timestamptz`` (plain ``timestamp``, naive UTC) is read and written in UTC too, whatever the server's
    time zone. Set outside a transaction so that the pool's rollback keeps it."""
    autocommit = getattr(dbapi_conn, "autocommit", None)
    if autocommit is not None:
        dbapi_conn.autocommit = True
    cur = dbapi_conn.cursor()
    cur.execute("SET TIME ZONE 'UTC'")
    cur.close()
    if autocommit is not None:
        dbapi_conn.autocommit = autocommit


def _read_only_uri(path: Path) -> str:
    """A ``mode=ro`` SQLite URI for ``path``. When SQLite could not create the ``-shm`` file it needs to read
    a WAL index (a read-only directory without one), the file is opened ``immutable``: with no ``-shm``
    there, no writer has it open."""
    params = "mode=ro"
    if not path.with_name(path.name + "-shm").exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        params += "&immutable=1"
    return f"file:{quote(str(path))}?{params}"


def _refuse_foreign_sqlite(path: Path, where: str, write: bool) -> None:
    """Look at an existing SQLite file read-only, before any pragma or table touches it: a file that is not
    a database, or a database holding tables but no ``runs`` (something else's), is not an index; for a reader
    (``write`` False) an empty one (0 bytes, no tables) is not one either: readers never write a schema."""
    if not path.is_file():
        return
    try:
        conn = sqlite3.connect(_read_only_uri(path), uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise IndexAccessError(f"{where} is not a kdeval index (not an SQLite database)") from None
        raise IndexAccessError(f"cannot open the index at {where} ({e})") from None
    if tables and "runs" not in tables:
        raise IndexAccessError(f"{where} is not a kdeval index (an SQLite database without a runs table)")
    if not tables and not write:
        raise IndexAccessError(_EMPTY.format(where=where))


#: A reader's message for a database without the index's tables.
_EMPTY = "{where} holds no kdeval index (an empty database; nothing submitted to it yet?)"


def _new_engine(url: str, read_only: bool) -> Engine:
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if read_only and path is not None:
            engine = create_engine(f"sqlite:///{_read_only_uri(path)}&uri=true",
                                   connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
            event.listen(engine, "connect", _sqlite_read_only_pragmas)
            return engine
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    parsed = make_url(url)
    connect_args = {}
    if parsed.get_driver_name() in ("psycopg2", "psycopg") and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgres_utc)
    return engine


def make_engine(db: str | Path | None = None, *, write: bool = True,
                on_wait: Callable[[str], None] | None = None) -> Engine:
    """Create an engine for ``db`` (URL or path), make the tables if missing and add the columns an index
    created by an older schema lacks (:mod:`kdeval.storage.migrate`).

    ``write=True`` (the driver, ``submit``, ``cancel``): an index this process cannot write is refused.
    ``write=False`` (``status``, reports): a SQLite file it cannot write is opened read-only and must already
    have the current schema. Raises :class:`IndexAccessError` when the place is not usable, and
    :class:`~kdeval.storage.sqlite_lock.IndexLockedError` when a writer found a SQLite index locked by another
    process for the whole busy timeout (``on_wait`` got one line when the wait began)."""
    where = str(db if db is not None else DEFAULT_DB_PATH)
    try:
        url = db_url(db, make_dirs=write)
    except OSError as e:
        raise IndexAccessError(f"cannot create the directory of {where}: {e.strerror or e}") from None
    path = sqlite_path(url)
    where = str(path) if path is not None else _safe_url(url)
    read_only = False
    if path is not None and not sqlite_writable(path):
        if write:
            raise IndexAccessError(f"{where} is read-only (this command writes to the index)")
        read_only = path.exists()
    if path is not None and not write and not path.exists():
        raise IndexAccessError(f"no index at {where} (nothing submitted yet?)")  # a reader creates nothing
    if path is not None:
        _refuse_foreign_sqlite(path, where, write)
    if path is not None and write:
        wait_for_write_lock(path, where, SQLITE_BUSY_TIMEOUT_MS / 1000, on_wait)
    try:
        engine = _new_engine(url, read_only)
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise IndexAccessError(_scrub(f"cannot open {where}: {_first_line(e)}{_driver_hint(e)}", url)) from None
    except ValueError:  # SQLAlchemy's own parse: a port that is not a number, an unclosed [IPv6 bracket
        raise IndexAccessError(f"cannot open {where}: not a valid database URL (expected "
                               "dialect://user:password@host:port/database, the port a number)") from None
    try:
        if read_only:
            _check_schema(engine, where)
        elif not write and not inspect(engine).has_table(Run.__tablename__):  # a reader creates nothing
            raise IndexAccessError(_EMPTY.format(where=where))
        else:
            _create_tables(engine)
            add_missing_columns(engine)
            if write and path is None:
                _check_writable(engine)
    except IndexAccessError:
        engine.dispose()
        raise
    except SQLAlchemyError as e:
        engine.dispose()
        raise IndexAccessError(_scrub(_describe(where, e, sqlite=path is not None), url)) from None
    event.listen(engine, "handle_error", _storage_errors(where, url))  # from now on, the index is in use
    return engine


def _check_schema(engine: Engine, where: str) -> None:
    """A read-only index must have every table and column this kdeval reads (it cannot be upgraded)."""
    have = set(inspect(engine).get_table_names())
    lacking = [t.name for t in Base.metadata.sorted_tables if t.name not in have]
    lacking += [f"{c.table.name}.{c.name}" for c in missing_columns(engine)]
    if lacking:
        raise IndexAccessError(f"{where} is read-only and lacks {', '.join(lacking)} (made by an older kdeval); "
                               "open it once where it is writable to bring it up to date")


def _check_writable(engine: Engine) -> None:
    """Plan an UPDATE that changes nothing and roll it back: a user without the privilege, a read-only
    transaction or a standby server fail here, before anything is written."""
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(update(Run).where(false()).values(state=Run.state))
        finally:
            trans.rollback()


def _safe_url(url: str) -> str:
    """The URL without its password, for messages: everything between the user's ``:`` and the last ``@`` of
    the URL's authority is ``***``, so a password holding ``@`` (unescaped) is hidden whole, and a URL that does
    not parse is masked the same way."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    query = rest.find("?")
    head = rest if query < 0 else rest[:query]
    at = head.rfind("@")
    if at < 0:
        return url
    user, colon, _ = head[:at].partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{rest[at:]}"


def _secret_parts(url: str) -> list[str]:
    """The password of ``url`` as written (between the user's ``:`` and the last ``@`` of the authority) and its
    ``@``-separated pieces: a driver that parsed ``user:pa@ss@host`` as host ``ss@host`` echoes a piece."""
    _, sep, rest = url.partition("://")
    head = rest.split("?", 1)[0]
    at = head.rfind("@")
    if not sep or at < 0 or ":" not in head[:at]:
        return []
    secret = head[:at].partition(":")[2]
    return sorted({secret, *secret.split("@")} - {""}, key=len, reverse=True)


def _scrub(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with every part of the URL's password replaced by ``***``."""
    for part in _secret_parts(url):
        text = text.replace(part, "***")
    return text


def _first_line(e: BaseException) -> str:
    """The first non-empty line of the database's own message (without SQLAlchemy's SQL and links)."""
    text = str(getattr(e, "orig", None) or e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _driver_hint(e: BaseException) -> str:
    if isinstance(e, ImportError) and "psycopg" in str(e):
        return " (pip install 'psycopg[binary]')"
    return ""


def _describe(where: str, e: SQLAlchemyError, *, sqlite: bool) -> str:
    """One line for a database error met while opening the index."""
    line = _first_line(e)
    low = line.lower()
    if sqlite and "not a database" in low:
        return f"{where} is not a kdeval index (not an SQLite database)"
    if "readonly" in low or "read-only" in low or "permission denied" in low:
        return f"{where} is read-only for this user ({line}); this command writes to the index"
    if isinstance(e, OperationalError) and not sqlite:
        return f"cannot connect to {where} ({line})"
    return f"cannot open the index at {where} ({line})"


#: How often ``_create_tables`` tries when another process creates the same tables at the same moment.
_CREATE_TRIES = 5


def _create_tables(engine: Engine) -> None:
    """``create_all``, tolerating another process creating the same tables at the same moment."""
    for attempt in range(_CREATE_TRIES):
        try:
            Base.metadata.create_all(engine)
            return
        except OperationalError as e:
            if "already exists" not in str(e) or attempt == _CREATE_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Session factory whose objects stay readable after commit (the driver keeps using them)."""
    return sessionmaker(engine, expire_on_commit=False)
