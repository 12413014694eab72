"""Connecting to Ray and describing worker resources.

``connect()`` starts a local Ray by default (every port on 127.0.0.1, no dashboard, no token auth) or
joins ``address`` (``auto`` or ``ray://host:10001``). Workers ask for ``num_cpus``, ``num_gpus`` and,
when the grid names one, an ``accelerator_type`` (Ray's ``accelerator_type:A100`` node resource), so an
A100 grid never lands on an H100 node. CPU-only workers are used when no GPU is asked for.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

NAMESPACE = "kdeval"


@dataclass(frozen=True)
class WorkerResources:
    """Resources of one worker actor."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    accelerator_type: str | None = None

    def actor_options(self) -> dict[str, Any]:
        """Options for ``ActorClass.options(...)``. No Ray-level restarts: the scheduler replaces
        dead workers and requeues their cells itself."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                                "max_restarts": 0, "max_task_retries": 0}
        if self.accelerator_type:
            opts["accelerator_type"] = self.accelerator_type
        return opts


def is_job_server(address: str | None) -> bool:
    """Whether ``address`` names a Ray job server (``http(s)://head:8265``), where ``submit --detach`` submits a
    Ray job; any other address (``host:port``, ``auto``, ``ray://...``) is a cluster a driver joins."""
    return bool(address) and address.startswith(("http://", "https://"))


def connect(address: str | None = None, *, num_cpus: int | None = None, quiet: bool = True) -> None:
    """Start or join Ray once per process (a no-op when already connected).

    ``address``: a cluster (``host:port`` of its GCS, ``auto``, ``ray://head:10001``), or None for a local
    Ray. A job server URL (``http(s)://head:8265``) is not a cluster to join: ``ConnectionError`` says so."""
    import ray  # here, not at import: the CLI names addresses without loading Ray

    if is_job_server(address):
        raise ConnectionError(f"--address {address} is a Ray job server, which only `submit --detach` uses; "
                              "to run here give the cluster's address: host:port, auto or ray://head:10001")
    if ray.is_initialized():
        return
    if not address:  # a local Ray: loopback only, so no token auth (and no warning about it); a cluster's
        _bind_loopback()  # binding and auth stay as the cluster configures them
        os.environ["RAY_AUTH_MODE"] = "disabled"
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": not quiet,
                              "configure_logging": True, "logging_level": "WARNING"}
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    except ConnectionError:
        raise
    except Exception as e:  # noqa: BLE001 - Ray raises several types for an unreachable cluster
        where = f"at {address}" if address else "locally"
        raise ConnectionError(f"cannot start or reach Ray {where}: {e}") from e
    if not address:
        _check_loopback(ray)


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


def _check_loopback(ray: Any) -> None:
    """Refuse to go on with a local Ray whose node address is not loopback (a Ray that no longer honours
    the switch above): its ports would be open to the network without auth."""
    ip = ray.util.get_node_ip_address()
    if not ip.startswith("127."):
        ray.shutdown()
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
