"""Fixtures of the scheduler-group tests: those of the service tests (temp index and results, a local Ray)."""
from __future__ import annotations

from tests.service.conftest import app, local_ray, paths  # noqa: F401 - fixtures used by this directory's tests
