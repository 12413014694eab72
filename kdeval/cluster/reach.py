"""Joining a Ray cluster at the address given, within a bounded time, or one line saying why not.

``--address`` names exactly what a driver joins: ``host:port`` (the head's GCS), ``auto`` (what Ray finds: the
``RAY_ADDRESS`` variable, else the cluster ``ray start`` last started on this machine) or ``ray://host:port``
(Ray Client). Before ``ray.init`` a driver checks, each step within what is left of ``timeout_s``:

1. that something listens at the address (a TCP connection: "connection refused" names a wrong port or a head
   that is down, a timeout an unreachable host);
2. that it is a Ray GCS that lets this driver in (a ``GcsClient`` in a child process, which the deadline
   kills: a token-authenticated cluster refuses a driver without its token, said with how to pass it);
3. then ``ray.init`` itself, in a thread, given what is left of the time.

A failure is a :class:`ClusterUnreachable` whose text is one line naming the address and the cause. Token
authentication is read as Ray reads it (``RAY_AUTH_MODE=token`` and the token in ``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); kdeval never turns a joined cluster's auth off.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

#: Seconds a driver may take to join a cluster (``--connect-timeout``).
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: Seconds one TCP connection attempt may take (within the overall timeout).
TCP_PROBE_S = 5.0

AUTH_HINT = ("set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (or a file named by "
             "RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) in the shell that runs kdeval")


class AddressError(ValueError):
    """``--address`` is not an address a driver joins (malformed, or a job server URL): bad input."""


class ClusterUnreachable(ConnectionError):
    """A driver could not join the cluster at its address; ``str()`` is one line naming the address and the
    cause."""


@dataclass(frozen=True)
class Target:
    """Where a driver connects: ``host``, ``port`` and whether it is Ray Client (``ray://``) or a GCS."""

    given: str
    host: str
    port: int
    client: bool = False

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def _split(addr: str, given: str, default_port: int | None) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep:
        host, port = addr, ""
    if not port and default_port is not None:
        port = str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"--address {given}: expected host:port, auto or ray://host:port")
    return host.strip("[]"), int(port)


def check_address(address: str) -> None:
    """:class:`AddressError` when ``address`` is not of a form a driver joins (``auto`` is not looked up)."""
    if address != "auto":
        resolve_target(address)


def resolve_target(address: str) -> Target:
    """The host and port ``address`` names (``auto`` resolved as Ray resolves it); :class:`AddressError` when
    it is malformed, :class:`ClusterUnreachable` when ``auto`` finds no cluster."""
    if address.startswith("ray://"):
        host, port = _split(address[len("ray://"):].split("/", 1)[0], address, 10001)
        return Target(address, host, port, client=True)
    addr = address
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            addr = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ClusterUnreachable("--address auto: no Ray cluster found (RAY_ADDRESS is not set and no "
                                     "`ray start` cluster runs on this machine); give its host:port") from None
    host, port = _split(addr, address, None)
    return Target(address, host, port)


def _where(t: Target) -> str:
    return t.given if t.given == f"{t.host}:{t.port}" else f"{t.given} ({t.host}:{t.port})"


def probe_tcp(t: Target, deadline: float) -> None:
    """Something listens at the target, or :class:`ClusterUnreachable` saying what happened."""
    left = max(0.1, min(TCP_PROBE_S, deadline - time.monotonic()))
    try:
        with socket.create_connection((t.host, t.port), timeout=left):
            return
    except ConnectionRefusedError:
        cause = "connection refused (no Ray head listens on that port: is it down, or is the port wrong?)"
    except socket.timeout:
        cause = f"no answer within {left:.0f}s (is the host reachable?)"
    except OSError as e:
        cause = e.strerror or type(e).__name__
    raise ClusterUnreachable(f"cannot reach the Ray cluster at {_where(t)}: {cause}")


def within(fn: Callable[[], Any], deadline: float) -> tuple[bool, Any, BaseException | None]:
    """Run ``fn`` in a daemon thread until ``deadline``: (finished, its value, what it raised)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    th = threading.Thread(target=run, name="kdeval-connect", daemon=True)
    th.start()
    th.join(max(0.0, deadline - time.monotonic()))
    return not th.is_alive(), box.get("value"), box.get("error")


def _auth_refused(e: BaseException | str | None) -> bool:
    text = e if isinstance(e, str) else f"{type(e).__name__} {e}" if e is not None else ""
    return "AuthenticationError" in text or "Unauthenticated" in text or "InvalidAuthToken" in text


#: Run in a child process by :func:`probe_gcs`: a GCS client that retries until the deadline kills it, and whose
#: C++ core logs every retry, stays out of the driver (its output is read, not shown).
_GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).cluster_id
except Exception as e:
    print(f"kdeval-probe: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
"""


def probe_gcs(t: Target, deadline: float, timeout_s: float) -> None:
    """The target is a Ray GCS that lets this driver in (asked by a child process with this environment, as
    ``ray.init`` will ask), or :class:`ClusterUnreachable` (auth refused, no GCS answering)."""
    try:
        got = subprocess.run([sys.executable, "-c", _GCS_PROBE, f"{t.host}:{t.port}"], capture_output=True,
                             text=True, timeout=max(0.5, deadline - time.monotonic()), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {_where(t)}: its port accepts connections but "
                                 f"no Ray GCS answered within {timeout_s:g}s (is it a Ray head's GCS port?)") from None
    if got.returncode == 0:
        return
    said = got.stderr or ""
    if _auth_refused(said):
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        raise ClusterUnreachable(f"the Ray cluster at {_where(t)} refused this driver's authentication "
                                 f"(RAY_AUTH_MODE is {mode}): {AUTH_HINT}")
    ours = [ln[len("kdeval-probe: "):] for ln in said.splitlines() if ln.startswith("kdeval-probe: ")]
    cause = ours[-1] if ours else (said.strip().splitlines() or [f"exit status {got.returncode}"])[-1]
    raise ClusterUnreachable(f"cannot reach the Ray cluster at {_where(t)}: {cause}")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class _DropThreadWarning(logging.Filter):
    """Ray's warning that ``ray.init`` outside the main thread sets no SIGTERM handler (set here instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


def init_within(target: Target, init: Callable[[], Any], deadline: float, timeout_s: float) -> None:
    """``init()`` (``ray.init`` joining ``target``) within ``deadline``, or :class:`ClusterUnreachable`. It runs
    in a thread, so the SIGTERM handler ``ray.init`` sets in the main thread (exit, so that Ray shuts down) is
    set here."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
    ray_log, quiet = logging.getLogger("ray._private.worker"), _DropThreadWarning()
    ray_log.addFilter(quiet)
    try:
        done, _, error = within(init, deadline)
    finally:
        ray_log.removeFilter(quiet)
    if not done:
        raise ClusterUnreachable(f"cannot join the Ray cluster at {_where(target)}: not connected within "
                                 f"{timeout_s:g}s (--connect-timeout)")
    if error is not None:
        if _auth_refused(error):
            raise ClusterUnreachable(f"the Ray cluster at {_where(target)} refused this driver's authentication: "
                                     f"{AUTH_HINT}") from error
        cause = error.__cause__ if error.__cause__ is not None else error
        raise ClusterUnreachable(f"cannot join the Ray cluster at {_where(target)}: {_one_line(cause)}") from error


def check_reachable(target: Target, timeout_s: float) -> float:
    """Steps 1 and 2 (TCP, then the GCS for a ``host:port``); returns the deadline that is left for step 3."""
    deadline = time.monotonic() + timeout_s
    probe_tcp(target, deadline)
    if not target.client:
        probe_gcs(target, deadline, timeout_s)
    return deadline
