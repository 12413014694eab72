"""Where the grid errors were before the grid got its own folder: they live in :mod:`kdeval.jobs.grid.errors`.

Kept only for the engine's tests (``tests/keydiff``, ``tests/baselines``) that still import this path; it goes
when they import the new one."""
from kdeval.jobs.grid.errors import GridError, GridIssue, join_path  # noqa: F401
