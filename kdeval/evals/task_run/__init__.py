"""Running a task on the engine: a cell's settings (``settings``: :class:`~kdeval.evals.task_run.settings.RunSettings`),
:func:`~kdeval.evals.task_run.runner.run_task` and the loops it drives (``question_runs`` one question per context,
``conversation`` several), the budget and chunk size resolved per sample (``budget``, ``chunking``), the rows
(``rows``), and several cells run as a group (``group_run``, ``generation_jobs``, ``group_decode``).

Kept light (no re-exports): the grid imports ``budget`` and ``chunking`` without torch."""
