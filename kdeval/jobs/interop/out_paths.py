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
