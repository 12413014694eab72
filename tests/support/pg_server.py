"""A throwaway PostgreSQL server for tests: initdb into a temp directory, listen on loopback only.

The server's time zone is deliberately not UTC (``America/New_York``), so a timestamp stored or read as
local time shows up as hours off. initdb refuses root, so under root the server runs as the ``postgres``
user that Debian's package creates. :func:`start` says why it cannot start instead of raising.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SERVER_TIMEZONE = "America/New_York"


@dataclass
class PgServer:
    """A running server; ``url()`` names one of its databases."""

    bin_dir: Path
    base: Path
    port: int
    user: str | None  # the OS user it runs as (None: this process's)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (immediate shutdown) and delete its directory."""
        _run([self.bin_dir / "pg_ctl", "-D", self.base / "data", "-m", "immediate", "-w", "stop"], self.user,
             timeout=60, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


def _bin_dir() -> Path | None:
    """Where initdb/pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (newest)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list, user: str | None, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], user=user, capture_output=True, text=True, timeout=timeout,
                          check=check, stdin=subprocess.DEVNULL, cwd="/")


def start() -> tuple[PgServer | None, str]:
    """Start a server; returns (server, "") or (None, why it could not start)."""
    try:
        import psycopg  # noqa: F401 - SQLAlchemy's PostgreSQL driver
    except ImportError:
        return None, "psycopg is not installed (requirements-ci.txt pins psycopg[binary])"
    bin_dir = _bin_dir()
    if bin_dir is None:
        return None, "PostgreSQL server binaries not found (apt-get install postgresql)"
    user = None
    base = Path(tempfile.mkdtemp(prefix="kdeval-pg-"))
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            return None, "running as root and there is no 'postgres' user to run the server as"
        user = "postgres"
        os.chown(base, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    opts = f"-k {base} -h 127.0.0.1 -p {port} -c timezone={SERVER_TIMEZONE} -c fsync=off"
    try:
        _run([bin_dir / "initdb", "-D", base / "data", "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--no-sync"], user, timeout=120)
        _run([bin_dir / "pg_ctl", "-D", base / "data", "-l", base / "server.log", "-o", opts, "-w", "-t", "60",
              "start"], user, timeout=90)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        log = base / "server.log"
        if log.exists():
            detail += " | " + log.read_text(errors="replace")[-500:]
        server = PgServer(bin_dir, base, port, user)
        server.stop()
        return None, f"PostgreSQL could not start: {detail.strip()[:800]}"
    return PgServer(bin_dir, base, port, user), ""
