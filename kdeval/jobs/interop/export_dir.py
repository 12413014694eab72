"""``kdeval export RUN --format kvpress|lm-eval --out DIR``: a run's done cells as a new directory of another
tool's files (:mod:`kdeval.jobs.interop.kvpress_export`, :mod:`kdeval.jobs.interop.lmeval_export`), written whole or not at all."""
from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from kdeval.jobs.interop.export import DoneCells, done_cells
from kdeval.jobs.interop.kvpress_export import kvpress_files
from kdeval.jobs.interop.lmeval_export import lmeval_files
from kdeval.jobs.interop.out_paths import (
    check_dir_target, clean_stale_staging, dir_mode, staging_prefix,
)
from kdeval.storage import RunIndex

#: Each directory format's (``kdeval.jobs.interop.export.DIR_FORMATS``) files (relative path -> text) from the run's id,
#: its cells' (view, rows) and a date.
FILES: dict[str, Callable[[str, list[tuple[Any, list[dict[str, Any]]]], datetime | None], dict[str, str]]] = {
    "kvpress": lambda run_id, cells, date: kvpress_files(run_id, cells),
    "lm-eval": lmeval_files,
}


def check_out_dir(out: str | Path) -> Path:
    """``out`` as an absolute directory path that does not exist yet or is empty, in a writable parent;
    ValueError naming ``--out`` otherwise."""
    out = Path(out).expanduser().absolute()
    check_dir_target(out)  # not through a symbolic link
    if out.parent.is_dir():
        clean_stale_staging(out)  # an export killed mid-write left its staging (inside an empty out, too)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out: {out} exists and is not an empty directory; expected a new directory")
    if not out.parent.is_dir():
        raise ValueError(f"--out: directory {out.parent} does not exist")
    if out.is_dir():  # empty: written into (it may be a mount point, which cannot be replaced)
        if os.statvfs(out).f_flag & os.ST_RDONLY:
            raise ValueError(f"--out: {out} is on a read-only file system")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(f"--out: directory {out} is not writable")
    elif not os.access(out.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out: directory {out.parent} is not writable")
    return out


def write_tree(out: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``out`` all at once, so a failure leaves nothing behind:
    into a temp directory beside it, then renamed into place; an existing empty ``out`` (a mount point, say,
    which cannot be replaced) gets the temp directory inside it, whose entries are then renamed up."""
    inside = out.is_dir()
    tmp = Path(tempfile.mkdtemp(prefix=staging_prefix(out), dir=out if inside else out.parent))
    os.chmod(tmp, dir_mode())  # as the umask says, not the temp directory's 0700
    moved: list[Path] = []
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if not inside:
            os.replace(tmp, out)
            return
        for entry in sorted(tmp.iterdir()):
            os.replace(entry, out / entry.name)
            moved.append(out / entry.name)
        tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for path in moved:
            shutil.rmtree(path, ignore_errors=True)
        raise


def export_dir(index: RunIndex, run_ref: str, fmt: str, out: str | Path, results_dir: str | Path | None = None,
               date: datetime | None = None) -> tuple[DoneCells, Path, list[str]]:
    """Check ``out``, gather the run's done cells (each read once) and write ``fmt``'s files under ``out``
    (``date``: lm-eval's, default now); returns (the cells, ``out``, the top-level directory names). Bad
    arguments raise ValueError naming ``--format``, ``--out`` or ``RUN`` before anything is written."""
    if fmt not in FILES:
        raise ValueError(f"--format: expected one of {', '.join(FILES)}, got {fmt!r}")
    out = check_out_dir(out)
    done = done_cells(index, run_ref, results_dir)
    files = FILES[fmt](done.run_id, done.rows(), date)
    try:
        write_tree(out, files)
    except OSError as exc:
        raise ValueError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    return done, out, sorted({rel.split("/")[0] for rel in files})
