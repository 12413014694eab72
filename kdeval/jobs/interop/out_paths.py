"""Where ``export`` and ``report`` write (``--out``): checked before anything is written, and files made with the
modes the user's umask gives (as any tool's output, readable by a team on a shared file system when the umask
says so), not the 0600/0700 of a temp file.

Refused, each with one line naming ``--out`` (a ``ValueError``): a target that exists and is not a regular file
(``/dev/full``, a FIFO, a socket: replacing it would replace the device node), and a target or directory that
is a symbolic link (``<link to /etc>/passwd``: the write would land where the link points, not where the user
looks); the user gives the real path instead.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import stat
from pathlib import Path

_KINDS = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a FIFO",
          stat.S_ISSOCK: "a socket"}


def umask() -> int:
    """This process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets under the umask (0644 under 022)."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode a new directory gets under the umask (0755 under 022)."""
    return 0o777 & ~umask()


def _link(path: Path) -> str | None:
    """``"<path> is a symbolic link to <target>"`` when ``path`` is one, else None."""
    if not path.is_symlink():
        return None
    return f"{path} is a symbolic link (to {os.readlink(path)}); give the real path"


def check_file_target(out: Path) -> None:
    """``out`` (absolute) may be written as a regular file: not a special file, neither it nor its directory a
    symbolic link; ``ValueError`` naming ``--out`` otherwise."""
    for place in (out, out.parent):
        why = _link(place)
        if why is not None:
            raise ValueError(f"--out: {why}")
    if out.exists():
        mode = out.stat().st_mode
        kind = next((name for test, name in _KINDS.items() if test(mode)), None)
        if kind is not None:
            raise ValueError(f"--out: {out} is {kind}, not a regular file; expected a file path")


def check_dir_target(out: Path) -> None:
    """``out`` (absolute) may be a directory written into: neither it nor its parent a symbolic link, and when it
    exists a directory; ``ValueError`` naming ``--out`` otherwise."""
    for place in (out, out.parent):
        why = _link(place)
        if why is not None:
            raise ValueError(f"--out: {why}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory; expected a directory")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def staging_prefix(out: Path) -> str:
    """The name prefix of what an export to ``out`` stages beside it: hidden, of this host and process."""
    return f".{out.name}.kdeval-{_host()}-{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def clean_stale_staging(out: Path) -> list[Path]:
    """Remove what exports to ``out`` killed on this host left staged beside it (or inside it, for a
    directory export into an empty ``out``): entries named by :func:`staging_prefix` whose process is gone.
    Returns them."""
    mine = re.compile(rf"^\.{re.escape(out.name)}\.kdeval-{re.escape(_host())}-(\d+)\.")
    removed = []
    for folder in {out.parent, out} if out.is_dir() else {out.parent}:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            found = mine.match(entry.name)
            if found is None or _alive(int(found.group(1))):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
