"""``nightly.on_fail``: tell someone. The user's command runs with the gate JSON's path as its last argument.

The command is split like a shell would (``shlex.split``) but never run by a shell: no expansion, no
pipes, nothing but the program and the arguments the user wrote. It has a timeout. Whatever it does —
fail, hang, be missing — is recorded beside the verdict and never changes it.
"""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any


def run_on_fail(command: str, gate_json: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``command gate_json``; what happened: ``{"command", "ok", "returncode", "error", "output"}``."""
    argv = shlex.split(command) + [str(gate_json)]  # the nightly file's validation made sure it splits
    out: dict[str, Any] = {"command": argv, "ok": False, "returncode": None, "error": "", "output": ""}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, shell=False)
    except subprocess.TimeoutExpired:
        out["error"] = f"timed out after {timeout_s:g}s"
        return out
    except OSError as e:
        out["error"] = f"could not run {argv[0]!r}: {e.strerror or e}"
        return out
    out.update(returncode=done.returncode, ok=done.returncode == 0,
               output=(done.stdout + done.stderr)[-2000:])
    if done.returncode != 0:
        out["error"] = f"exited with status {done.returncode}"
    return out
