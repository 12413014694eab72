"""What a task is and what every task uses: :class:`~kdeval.evals.tasks.base.Task` and its samples and errors
(``base``), data files and the hub (``data``, ``hub``), prompt building and truncation (``prompting``), the base of
tasks generated per tokenizer and length (``synthetic``), scoring stored predictions (``scoring``), the thinking
block stripped before scoring (``thinking``) and what a task instance reads before a model loads (``identity``).

Nothing here imports a benchmark or the run side; importing it does not import torch.
"""
