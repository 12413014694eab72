"""``--plugin FILE_OR_MODULE``: the option every command that builds policies takes (``submit``, ``resume``,
``nightly``, ``generate``, ``policies``, ``check-policy``), and loading the plugins it names with the installed
entry-point plugins (:mod:`kdeval.cluster.plugins`); a bad plugin is one line and exit 2, before anything is
written."""
from __future__ import annotations

from typing import Sequence

import typer

from kdeval.cli.errors import bad_input

PLUGIN_HELP = ("A Python file or importable module whose eviction policies the command may use (repeatable); "
               "installed packages register theirs through the entry-point group kdeval.policies. A grid never "
               "names code: it names the policies.")


def plugin_option() -> list[str]:
    """A fresh ``--plugin`` option (Typer options are defaults of the command's parameters)."""
    return typer.Option([], "--plugin", help=PLUGIN_HELP)


def load_cli_plugins(refs: Sequence[str]) -> None:
    """Load the installed entry-point plugins and ``refs``; a bad one: one line on stderr, exit 2."""
    from kdeval.cluster.plugins import load_plugins

    with bad_input():
        load_plugins(refs)
