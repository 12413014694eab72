"""The benchmarks, one file or folder each, built on :mod:`kdeval.evals.tasks`; ``registry`` names their tasks
(``needle``, ``ruler.niah_single_1``, ``scbench.kv``, ...). Each benchmark imports only the task plumbing, the
metrics and its own files (``turns`` reuses RULER's needles and InfiniteBench's records)."""
