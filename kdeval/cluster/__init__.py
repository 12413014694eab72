"""Cluster: Ray connection, worker actors that keep a loaded model across cells, the cell workloads.

- :mod:`~kdeval.cluster.raysetup` — ``connect()`` and :class:`WorkerResources` (CPU/GPU/accelerator type)
- :mod:`~kdeval.cluster.worker` — the worker actor (one model held, one cell at a time)
- :mod:`~kdeval.cluster.workload` — :class:`CellTask` in, :class:`CellOutcome` out
- :mod:`~kdeval.cluster.execute` — the real workload (engine + evals runner)
- :mod:`~kdeval.cluster.stub` — a model-free workload of known cost (tests, benchmark, smoke runs)
- :mod:`~kdeval.cluster.catalog` — policy/model names for grid validation
"""
