"""The requests a question loop sends to the engine, as values: a loop written as a generator yields each
:class:`GenerateJob` and is sent back its :class:`~kdeval.keydiff.loop.state.GenerationResult`.

A cell run on its own answers every job at once with its own ``Engine.generate`` (:func:`answer_alone`); a group
of cells (:func:`kdeval.evals.task_run.group_run.run_group`) may collect the jobs of several cells first and decode them
together (:mod:`kdeval.evals.task_run.group_decode`). The loop is the same code either way, so a cell's rows are built
the same way whoever answered its jobs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, TypeVar

T = TypeVar("T")

#: a question loop: yields jobs, is sent their results, returns its rows (or whatever it returns)
JobLoop = Generator["GenerateJob", Any, T]


@dataclass
class GenerateJob:
    """One ``Engine.generate`` call, not yet made: ``ids [1, L]`` after ``state`` on ``engine``, with its
    generation length, eos ids, protected question and decode rule; ``sample_id`` names the row it becomes."""

    engine: Any
    ids: Any
    max_new_tokens: int
    eos: Any
    state: Any
    protect_last: int
    decode_evict: bool
    sample_id: str

    def run(self, prompt_only: bool = False) -> Any:
        """The call itself (``prompt_only``: up to the first token, see ``Engine.generate``)."""
        return self.engine.generate(self.ids, max_new_tokens=self.max_new_tokens, eos_token_id=self.eos,
                                    state=self.state, protect_last=self.protect_last,
                                    decode_evict=self.decode_evict, prompt_only=prompt_only)


def answer_alone(loop: JobLoop[T]) -> T:
    """Run ``loop`` to its end, each job answered by its own ``Engine.generate``; what the loop returns."""
    try:
        job = next(loop)
        while True:
            job = loop.send(job.run())
    except StopIteration as stop:
        return stop.value
