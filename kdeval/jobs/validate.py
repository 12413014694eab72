"""Where grid loading was before the grid got its own folder: it lives in :mod:`kdeval.jobs.grid.load`.

Kept only for the engine's tests (``tests/keydiff``, ``tests/baselines``) and the engine comment that still name
this path; it goes when they name the new one."""
from kdeval.jobs.grid.load import load_grid, load_mapping, parse_grid, validate_mapping  # noqa: F401
