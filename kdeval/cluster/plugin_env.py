"""Plugins on Ray workers: what a run's workers must import (:mod:`kdeval.cluster.plugins`) reaches them.

A plugin file or a module that is not installed is shipped with each worker actor through Ray's runtime
environment (``py_modules``: Ray uploads it once per content and puts it on the worker's path), so a cluster's
nodes need no copy; an installed package (an entry point, or a module of an installed distribution) is not
shipped: :func:`check_nodes` asks every alive node to import it before any cell is dispatched, and names the node
that cannot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from kdeval.cluster.plugins import PluginError, PluginSpec

#: seconds every node may take to import the installed plugins
NODE_CHECK_TIMEOUT_S = 120.0


def shipped_modules(specs: Sequence[PluginSpec]) -> tuple[str, ...]:
    """The local files and package folders Ray ships to workers (``runtime_env["py_modules"]``)."""
    return tuple(sorted({s.ship for s in specs if s.ship}))


def upload_modules(paths: Sequence[str]) -> tuple[str, ...]:
    """Upload plugin files and folders to the connected cluster once per content and return their URIs, which
    an actor's own runtime environment takes (Ray takes local paths only for a whole job's, at ``ray.init``, and
    through a ``ray://`` client, which uploads them itself). Every file of a folder goes, ``.gitignore`` or not:
    the plugin's digest covers each of its ``.py`` files."""
    if not paths:
        return ()
    import shutil
    import tempfile

    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed  # what ray.init does for a job

    if ray.util.client.ray.is_connected():
        return tuple(paths)
    scratch = tempfile.mkdtemp(prefix="kdeval-plugins-")
    try:
        env = upload_py_modules_if_needed({"py_modules": list(paths)}, include_gitignore=False,
                                          scratch_dir=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tuple(env["py_modules"])


def _import_here(specs: Sequence[PluginSpec]) -> str | None:
    """Runs on a node: None when every plugin imports with the driver's digest, else why not (one line)."""
    from kdeval.cluster.plugins import ensure

    try:
        ensure(specs)
    except PluginError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - reported to the driver
        return f"{type(e).__name__}: {e}"
    return None


def check_nodes(specs: Sequence[PluginSpec], timeout_s: float = NODE_CHECK_TIMEOUT_S) -> None:
    """Raise :class:`PluginError` naming the first node of the connected cluster that cannot import the
    installed plugins of ``specs`` (those Ray does not ship); nothing to do when there are none."""
    installed = [s for s in specs if not s.ship]
    if not installed:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_import_here)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs: dict[Any, dict] = {}
    for node in nodes:
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        refs[probe.options(scheduling_strategy=strategy).remote(installed)] = node
    try:
        answers = ray.get(list(refs), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise PluginError(f"plugins {', '.join(s.ref for s in installed)}: the nodes did not answer whether they "
                          f"import them within {timeout_s:g} s") from None
    for (ref, node), why in zip(refs.items(), answers):
        if why is not None:
            names = ", ".join(s.ref for s in installed)
            raise PluginError(f"plugin {names}: node {node['NodeID'][:12]} ({node.get('NodeManagerAddress')}) "
                              f"cannot import it: {why}")


@dataclass(frozen=True)
class PluginWorkload:
    """A workload whose cells run plugin policies: imports ``plugins`` on the worker (:func:`kdeval.cluster.
    plugins.ensure`: by module name, the digest the driver computed) before it hands each call to ``inner``.
    Kept apart from the evaluation workload, whose code is hashed into every cell's identity."""

    inner: Any
    plugins: tuple[PluginSpec, ...]

    def _ready(self) -> Any:
        from kdeval.cluster.plugins import ensure

        ensure(self.plugins)
        return self.inner

    def load(self, task: Any) -> Any:
        return self._ready().load(task)

    def run(self, handle: Any, task: Any) -> Any:
        return self._ready().run(handle, task)

    def run_group(self, handle: Any, tasks: list, on_samples: Any = None, on_result: Any = None) -> list:
        return self._ready().run_group(handle, tasks, on_samples, on_result)

    def aggregate(self, task: Any, rows: list) -> dict:
        return self.inner.aggregate(task, rows)
