"""SCBench: its released files asked as turns (``task``), each task's prompt and scorer (``specs``), and the
scorers ported from its code (``metrics``, ``repoqa``)."""
