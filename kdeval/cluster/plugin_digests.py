"""A plugin's identity: a digest of its source (the file, or every ``.py`` file of its top-level package) and its
distribution's version, so that an edit recomputes a cell and an unchanged plugin reuses it."""
from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

from kdeval.cluster.plugin_types import PluginError

#: a plugin file or package larger than this is refused before it is read (source, not data)
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def source_files(module: ModuleType) -> tuple[Path, list[Path]]:
    """The root whose ``.py`` files make a plugin's code (its top-level package folder, or its own file) and
    those files."""
    top = sys.modules.get(module.__name__.split(".")[0], module)
    paths = getattr(top, "__path__", None)
    if paths:
        root = Path(list(paths)[0]).resolve()
        return root, sorted(root.rglob("*.py"))
    file = Path(inspect.getsourcefile(module) or module.__file__).resolve()
    return file.parent, [file]


def source_digest(root: Path, files: Sequence[Path], version: str | None, ref: str) -> str:
    """sha256 (16 hex digits) of the files' relative paths and bytes and the distribution ``version``;
    refuses sources above :data:`MAX_SOURCE_BYTES`."""
    total = sum(f.stat().st_size for f in files)
    if total > MAX_SOURCE_BYTES:
        raise PluginError(f"plugin {ref}: expected Python source of at most {MAX_SOURCE_BYTES // 2**20} MiB, "
                          f"got {total / 2**20:.1f} MiB in {root}")
    h = hashlib.sha256(f"version={version or ''}\0".encode())
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def distribution(module_name: str) -> importlib.metadata.Distribution | None:
    """The installed distribution that provides top-level module ``module_name``'s package, if any."""
    top = module_name.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    for name in names:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def module_digest(module: ModuleType, ref: str, version: str | None) -> str:
    root, files = source_files(module)
    return source_digest(root, files, version, ref)
