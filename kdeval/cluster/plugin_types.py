"""The plugin types every plugin module shares: the one-line error, what a worker needs to import a plugin
(:class:`PluginSpec`, picklable) and a plugin loaded into this process."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class PluginError(ValueError):
    """A plugin that cannot be used: one line naming it and what was expected."""


@dataclass(frozen=True)
class PluginSpec:
    """A loaded plugin as a worker needs it (picklable): how to import it and which digest to find.

    ``kind``: ``file``, ``module`` or ``entry point``; ``ref``: what the user named (a path, a module name, or
    ``group:name`` of an entry point); ``module``: the module name workers import; ``ship``: a local file or
    package folder Ray ships to workers (None: installed, importable on every node already)."""

    kind: str
    ref: str
    module: str
    digest: str
    ship: str | None = None
    version: str | None = None

    @property
    def origin(self) -> str:
        """Where its policies came from, as ``kdeval policies`` prints it."""
        version = f" ({self.version})" if self.version else ""
        if self.kind == "file":
            return f"plugin file {Path(self.ref).name}"
        if self.kind == "module":
            return f"plugin module {self.ref}{version}"
        return f"entry point {self.ref}{version}"


@dataclass(frozen=True)
class Plugin:
    """A plugin loaded into this process and the policy names it registered."""

    spec: PluginSpec
    policies: tuple[str, ...]


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or "(no message)"
