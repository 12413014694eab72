"""Files from users read as untrusted input: a model's ``config.json``, its tokenizer files, a kvpress
result's ``config.yaml`` and ``metrics.json``. A leaf helper any layer may import (the standard library and
PyYAML only).

Every reader here:

- refuses what is not a regular file (a FIFO, a device, a socket, a directory) before reading a byte: the file
  is opened without blocking and the open descriptor's own status is checked, so a FIFO never hangs the
  reader;
- refuses a file beyond a size (checked on the descriptor, then the read itself is cut one byte past it);
- parses with bounded nesting (JSON and YAML alike) and, for YAML, no aliases (``*name``: an alias bomb of a
  few hundred bytes expands to billions of values as soon as anything walks it);
- raises :class:`UntrustedFileError`, a ``ValueError`` whose message is one line naming the file (and the
  field, where one is at fault) and what was expected.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Iterator

import yaml

#: The deepest nesting (mappings and lists inside each other) a parsed file may have.
MAX_DEPTH = 64


class UntrustedFileError(ValueError):
    """A file read as untrusted input is refused; the message names the file and what was expected."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_head(path: str | Path, max_bytes: int, head: int | None = None) -> tuple[bytes, int]:
    """(the first ``head`` bytes of ``path``, or all of them when ``head`` is None; its size) when it is a
    regular file of at most ``max_bytes``; :class:`UntrustedFileError` otherwise (also when it cannot be
    opened: the OS's reason)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise UntrustedFileError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{path} is {_kind(info.st_mode)}; expected a regular file")
        if info.st_size > max_bytes:
            raise UntrustedFileError(f"{path} is {info.st_size} bytes; at most {max_bytes} are read")
        data = os.pread(fd, max_bytes + 1 if head is None else head, 0)
    except OSError as e:
        raise UntrustedFileError(f"{path} cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise UntrustedFileError(f"{path} is more than {max_bytes} bytes; at most {max_bytes} are read")
    return data, info.st_size


def read_bytes(path: str | Path, max_bytes: int) -> bytes:
    """``path``'s bytes when it is a regular file of at most ``max_bytes`` (:func:`read_head`)."""
    return read_head(path, max_bytes)[0]


def read_text(path: str | Path, max_bytes: int) -> str:
    """:func:`read_bytes` decoded as UTF-8 (invalid bytes: one line naming the offset)."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UntrustedFileError(f"{path} is not UTF-8 text (byte {data[e.start]:#04x} at offset "
                                 f"{e.start})") from None


def join(path: tuple[Any, ...]) -> str:
    """``("rope_scaling", "factor")`` -> ``rope_scaling.factor``; ``("a", 3)`` -> ``a[3]``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def walk(value: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) of a parsed document, containers included, without recursion (any depth)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        path, v = stack.pop()
        yield path, v
        if isinstance(v, dict):
            stack.extend((path + (k,), c) for k, c in v.items())
        elif isinstance(v, list):
            stack.extend((path + (i,), c) for i, c in enumerate(v))


def check_depth(value: Any, source: str | Path, max_depth: int = MAX_DEPTH) -> None:
    """:class:`UntrustedFileError` when ``value`` nests deeper than ``max_depth`` (walked, not recursed)."""
    for path, v in walk(value):
        if len(path) > max_depth:
            raise UntrustedFileError(f"{source} is nested deeper than {max_depth} levels")


def non_finite(value: Any) -> tuple[str, float] | None:
    """The first (field path, number) of ``value`` that is NaN or infinite, or None."""
    for path, v in walk(value):
        if isinstance(v, float) and not math.isfinite(v):
            return join(path), v
    return None


def load_json(path: str | Path, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file read with :func:`read_text` and parsed with bounded nesting (``NaN`` and ``Infinity`` parse
    as floats: the caller names the field they are in, :func:`non_finite`)."""
    text = read_text(path, max_bytes)
    try:
        value = json.loads(text)
    except RecursionError:
        raise UntrustedFileError(f"{path} is nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise UntrustedFileError(f"{path} is not valid JSON ({e})") from None
    check_depth(value, path, max_depth)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and nesting deeper than :data:`MAX_DEPTH`."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted",
                                              event.start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(path: str | Path, max_bytes: int) -> Any:
    """A YAML file read with :func:`read_text` and parsed safely: no tags beyond ``yaml.safe_load``'s, no
    aliases, nesting of at most :data:`MAX_DEPTH`."""
    text = read_text(path, max_bytes)
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        why = getattr(e, "problem", None) or e
        raise UntrustedFileError(f"{path} is not readable YAML: {where}{why}") from None
    except RecursionError:
        raise UntrustedFileError(f"{path} is nested deeper than {MAX_DEPTH} levels") from None
