"""The environment a kdeval subprocess of a test gets, and the settings of the Ray clusters tests build.

A kdeval process a test starts runs as from a user's shell: no ``RAY_*`` variable, whatever this process set (a
test that passes ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` or ``RAY_AUTH_MODE`` would hide that the product does not
set them itself). The clusters tests build in this process (``ray.init``, ``ray.cluster_utils``) are not
the product: :func:`sandbox_ray` puts them on loopback without the auth service, as kdeval does for its local
Ray, before each one starts.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def user_env(**extra: str) -> dict[str, str]:
    """This process's environment less every ``RAY_*`` variable, with the checkout on ``PYTHONPATH`` and
    ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def sandbox_ray() -> None:
    """Settings of a Ray cluster a test builds in this process: every node on 127.0.0.1, no token auth (Ray
    reads the binding switch when imported: its constant is set too)."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["RAY_AUTH_MODE"] = "disabled"
