"""Connecting to Ray and describing worker resources.

``connect()`` starts a local Ray by default (every port on 127.0.0.1, no dashboard, no token auth) or
joins ``address`` (``host:port``, ``auto`` or ``ray://host:10001``) within a bounded time
(:mod:`kdeval.cluster.reach`). Workers ask for ``num_cpus``, ``num_gpus`` and,
when the grid names one, an ``accelerator_type`` (Ray's ``accelerator_type:A100`` node resource), so an
A100 grid never lands on an H100 node. CPU-only workers are used when no GPU is asked for.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kdeval.cluster.reach import (
    DEFAULT_CONNECT_TIMEOUT_S, AddressError, ClusterUnreachable, check_reachable, init_within, resolve_target,
)

__all__ = ["AddressError", "ClusterUnreachable", "NAMESPACE", "WorkerResources", "connect", "is_job_server",
           "missing_resources"]

NAMESPACE = "kdeval"


@dataclass(frozen=True)
class WorkerResources:
    """Resources of one worker actor."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    accelerator_type: str | None = None
    #: the URIs of the plugin files and folders shipped to the worker (Ray's ``runtime_env`` ``py_modules``,
    #: :func:`kdeval.cluster.plugin_env.upload_modules`)
    py_modules: tuple[str, ...] = ()

    def actor_options(self) -> dict[str, Any]:
        """Options for ``ActorClass.options(...)``. No Ray-level restarts: the scheduler replaces
        dead workers and requeues their cells itself."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                                "max_restarts": 0, "max_task_retries": 0}
        if self.accelerator_type:
            opts["accelerator_type"] = self.accelerator_type
        if self.py_modules:
            opts["runtime_env"] = {"py_modules": list(self.py_modules)}
        return opts


def is_job_server(address: str | None) -> bool:
    """Whether ``address`` names a Ray job server (``http(s)://head:8265``), where ``submit --detach`` submits a
    Ray job; any other address (``host:port``, ``auto``, ``ray://...``) is a cluster a driver joins."""
    return bool(address) and address.startswith(("http://", "https://"))


def connect(address: str | None = None, *, num_cpus: int | None = None, quiet: bool = True,
            timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Start or join Ray once per process (a no-op when already connected).

    ``address``: a cluster (``host:port`` of its GCS, ``auto``, ``ray://head:10001``), or None for a local
    Ray of this process's own (never one found on the machine). Joining takes at most ``timeout_s`` seconds, or
    :class:`~kdeval.cluster.reach.ClusterUnreachable` says in one line why not (:mod:`kdeval.cluster.reach`).
    A loopback address keeps every process this one starts on loopback, as a local Ray does. A job server URL
    (``http(s)://head:8265``) is not a cluster to join: :class:`AddressError` says so."""
    import ray  # here, not at import: the CLI names addresses without loading Ray

    if is_job_server(address):
        raise AddressError(f"--address {address} is a Ray job server, which only `submit --detach` uses; "
                           "to run here give the cluster's address: host:port, auto or ray://head:10001")
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": not quiet,
                              "configure_logging": True, "logging_level": "WARNING"}
    if address:
        _join(ray, address, timeout_s, kwargs)
        return
    _bind_loopback()  # a local Ray: loopback only, so no token auth (and no warning about it)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:  # "local": a Ray of its own, not a cluster RAY_ADDRESS or an earlier `ray start` names
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - Ray raises several types
        raise ConnectionError(f"cannot start Ray locally: {e}") from e
    _check_loopback(ray)


def _join(ray: Any, address: str, timeout_s: float, kwargs: dict[str, Any]) -> None:
    """Join the cluster at ``address`` within ``timeout_s`` (a loopback one from loopback); its auth stays as
    the shell sets it (``RAY_AUTH_MODE``), never turned off here."""
    target = resolve_target(address)
    if target.loopback:
        _bind_loopback()  # else Ray dials the host's other interface for 127.0.0.1, and its processes bind there
    deadline = check_reachable(target, timeout_s)
    init_within(target, lambda: ray.init(address=address, **kwargs), deadline, timeout_s)
    if target.loopback and not target.client:
        _check_loopback(ray, joined=address)


def _bind_loopback() -> None:
    """Make the local Ray that ``ray.init`` is about to start take 127.0.0.1 as its node address.

    Ray's processes (GCS, raylets, workers, the driver's own server) bind to the node address, which Ray
    takes from the host's network interface unless its cluster mode is off. Ray reads that switch
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``) into a constant when it is imported, so setting the variable
    after ``import ray`` changes nothing: the constant itself is switched off here, and the variable is
    set for the processes Ray starts."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _check_loopback(ray: Any, joined: str | None = None) -> None:
    """Refuse to go on with a local Ray whose node address is not loopback (a Ray that no longer honours
    the switch above): its ports would be open to the network without auth. ``joined``: the loopback address
    of a cluster this process joined, whose driver must stay on loopback too."""
    ip = ray.util.get_node_ip_address()
    if not ip.startswith("127."):
        ray.shutdown()
        if joined:
            raise ClusterUnreachable(f"joining the Ray cluster at {joined}, this driver took node address {ip}, "
                                     "not loopback: refusing to run it there (give the head's own address)")
        raise ConnectionError(f"the local Ray took node address {ip}, not 127.0.0.1: refusing to run it "
                              "unauthenticated on a network interface (start a cluster and pass --address)")


def missing_resources(res: WorkerResources) -> str | None:
    """Why no node in the cluster can ever host a worker (None when some node can), for messages."""
    import ray

    total = ray.cluster_resources()
    if res.num_gpus > 0 and total.get("GPU", 0) < res.num_gpus:
        return f"no GPU in the cluster (workers ask for {res.num_gpus:g} GPU each)"
    if res.accelerator_type and f"accelerator_type:{res.accelerator_type}" not in total:
        have = sorted(k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:"))
        return (f"no node offers accelerator_type {res.accelerator_type}"
                f" (available: {', '.join(have) or 'none'})")
    if total.get("CPU", 0) < res.num_cpus:
        return f"workers ask for {res.num_cpus:g} CPU but the cluster has {total.get('CPU', 0):g}"
    return None
