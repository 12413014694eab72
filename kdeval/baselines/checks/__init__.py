"""The engine's invariant matrix, run on any policy (built-in or a plugin's): ``kdeval check-policy NAME`` and
the suite's own matrix over the built-in policies call the same code
(:func:`~kdeval.baselines.checks.matrix.run_matrix`)."""
from kdeval.baselines.checks.matrix import CHECKS, FAMILIES, Finding, run_matrix

__all__ = ["CHECKS", "FAMILIES", "Finding", "run_matrix"]
