"""Engine and session factory for the index: SQLite (WAL, busy timeout) by default, any SQLAlchemy URL."""
from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from kdeval.storage.migrate import add_missing_columns
from kdeval.storage.models import Base

#: Default index location, relative to the working directory (``--db`` overrides it).
DEFAULT_DB_PATH = Path(".kdeval") / "index.sqlite"

#: How long a SQLite connection waits for the writer's lock before raising (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000


def db_url(db: str | Path | None, *, make_dirs: bool = True) -> str:
    """Turn ``--db`` (a SQLAlchemy URL, a file path, or None for the default) into a URL.

    With ``make_dirs`` the parent directory of a SQLite file is created."""
    if db is None:
        db = DEFAULT_DB_PATH
    text = str(db)
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other databases or in-memory SQLite)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix):
        return Path(url[len(prefix):])
    return None


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    """WAL lets readers (``kdeval status``) read while the driver writes (the busy timeout that waits
    for locks is set by ``make_engine``'s ``timeout`` connect argument)."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(db: str | Path | None = None) -> Engine:
    """Create an engine for ``db`` (URL or path), make the tables if missing and add the columns an index
    created by an older schema lacks (:mod:`kdeval.storage.migrate`)."""
    url = db_url(db)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    _create_tables(engine)
    add_missing_columns(engine)
    return engine


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
