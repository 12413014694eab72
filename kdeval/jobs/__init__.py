"""Jobs: grid files, cells, the scheduler loop, run operations (submit/resume/cancel/rescore).

- :mod:`~kdeval.jobs.grid` / :mod:`~kdeval.jobs.validate` — the grid schema and ``load_grid`` (GridError)
- :mod:`~kdeval.jobs.cells` — expansion into cells with content-hash ids
- :mod:`~kdeval.jobs.scheduler` — the ``ray.wait`` loop (affinity, retries, dead-worker replacement)
- :mod:`~kdeval.jobs.service` — ``create_run`` / ``execute_run`` / ``cancel_run`` used by the CLI
- :mod:`~kdeval.jobs.rescore` — recompute stored scores with the current metric code
"""
