"""``nightly.on_fail``: tell someone. The user's command runs with the gate JSON's path as its last argument.

The command is split like a shell would (``shlex.split``) but never run by a shell: no expansion, no
pipes, nothing but the program and the arguments the user wrote. It has a timeout, past which its whole process
group is killed (what it started in the background too: nothing it started outlives the gate, and none of it
holds the gate's pipes open). Whatever it does — fail, hang, be missing — is recorded beside the verdict and
never changes it.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any


def run_on_fail(command: str, gate_json: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``command gate_json``; what happened: ``{"command", "ok", "returncode", "error", "output"}``."""
    argv = shlex.split(command) + [str(gate_json)]  # the nightly file's validation made sure it splits
    out: dict[str, Any] = {"command": argv, "ok": False, "returncode": None, "error": "", "output": ""}
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, shell=False, start_new_session=True)
    except OSError as e:
        out["error"] = f"could not run {argv[0]!r}: {e.strerror or e}"
        return out
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out["error"] = f"timed out after {timeout_s:g}s (its process group was killed)"
        return out
    finally:
        _kill_group(proc)  # the children it left running when it exited
    out.update(returncode=proc.returncode, ok=proc.returncode == 0, output=(stdout + stderr)[-2000:])
    if proc.returncode != 0:
        out["error"] = f"exited with status {proc.returncode}"
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (its own session) and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass
