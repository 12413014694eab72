"""Jobs: everything between a grid file and its results, one folder per job.

- :mod:`~kdeval.jobs.grid` — the grid schema, ``load_grid`` (errors that name the field), cells and their identity
- :mod:`~kdeval.jobs.run` — ``create_run`` / ``execute_run`` / ``cancel_run``, the scheduler loop (shards, groups,
  affinity, holds), what each outcome records, progress, index recovery, rescoring
- :mod:`~kdeval.jobs.nightly` — ``kdeval nightly``: the run, the gate, the history
- :mod:`~kdeval.jobs.interop` — ``kdeval export`` and ``kdeval import``: other tools' files
- :mod:`~kdeval.jobs.reports` — what a report computes (deltas, CIs, headlines, speed, memory, contrasts), and in
  :mod:`~kdeval.jobs.reports.render` how it is drawn
"""
