"""The one generation loop: every request's prompt steps, then its greedy tokens, one forward per step.

``Engine.generate`` (rows of one length that share positions, batch 1 included: a batch of one row) and
``Engine.generate_batch`` (independent requests of any lengths, kdeval/keydiff/batch/batching.py) both run
:class:`GenerationLoop`; they differ only in the forward they hand it (one :class:`~kdeval.keydiff.step.step.Step`
on a shared cache, or a ragged step over a batch whose rows leave when they finish).

A request's steps (:func:`prompt_steps`): its prompt in chunks of ``B`` (evicting), then its protected question in
chunks of ``B`` (not evicting, protected: kvpress's protocol), then one step per generated token but the last.
After the step that ends its prompt, the greedy token of the step's last column is its first; it stops at an
eos token (not kept) or after ``max_new`` tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kdeval.keydiff.loop.memory import PeakMemory
from kdeval.keydiff.loop.state import RunStats

#: one row's input of a step: its token ids ``[t]`` (a prompt chunk) or its pending token, whether the step
#: evicts, whether its tokens become protected
Feed = tuple[torch.Tensor | int, bool, bool]


def eos_ids(eos_token_id: int | list[int] | None) -> set[int]:
    """The token ids that end a request."""
    return set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))


def check_protect(protect_last, length: int, name: str = "protect_last") -> int:
    """``protect_last``, checked: an integer number of a ``length``-token prompt's last tokens (``ValueError``
    naming ``name`` otherwise)."""
    if not isinstance(protect_last, int) or isinstance(protect_last, bool) or not 0 <= protect_last <= length:
        raise ValueError(f"{name}: expected 0 .. {length} prompt tokens, got {protect_last!r}")
    return protect_last


def prompt_steps(ids: torch.Tensor, chunk: int, protect_last: int) -> list[Feed]:
    """The prompt steps of ``ids [L]`` (or ``[rows, L]``, cut along the tokens): chunks of the unprotected part
    (evicting), then of the last ``protect_last`` tokens (not evicting, protected). The one place a prompt is cut
    into steps."""
    split = ids.shape[-1] - protect_last
    steps = [(ids[..., s : min(s + chunk, split)], True, False) for s in range(0, split, chunk)]
    steps += [(ids[..., split + s : split + s + chunk], False, True) for s in range(0, protect_last, chunk)]
    return steps


@dataclass
class Request:
    """One request's progress: its prompt steps, then its greedy tokens."""

    index: int  # its place in the caller's list (or its row of a shared batch)
    steps: list[Feed]
    max_new: int
    done_chunks: int = 0
    taken: int = 0  # greedy choices made
    pending: int = 0  # the token to feed next
    out: list[int] = field(default_factory=list)
    prompt_tokens: int = 0  # tokens processed when the prompt ended (a start state's included)
    finished: bool = False
    t_first: float = 0.0
    ttft: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.done_chunks < len(self.steps)

    @property
    def ending_prompt(self) -> bool:
        """The step about to run is its prompt's last."""
        return self.done_chunks == len(self.steps) - 1

    def feed(self, decode_evict: bool) -> Feed:
        """Its next step's input: a prompt chunk, else its pending token."""
        return self.steps[self.done_chunks] if self.prefilling else (self.pending, decode_evict, False)

    def stats(self, decode_s: float, memory: PeakMemory, *, peak_kv_tokens: int, kept_tokens: int,
              kv_cache_bytes: int, peak_kv_bytes: int, decode_tokens: int | None = None) -> RunStats:
        """Its figures, the cache's counts given by the caller (``decode_tokens``: its own tokens by default)."""
        decoded = len(self.out) if decode_tokens is None else decode_tokens
        return RunStats.of_run(prompt_tokens=self.prompt_tokens, ttft_s=self.ttft, decode_s=decode_s,
                               decode_tokens=decoded, peak_kv_tokens=peak_kv_tokens, kept_tokens=kept_tokens,
                               peak_memory_bytes=memory.peak_bytes, kv_cache_bytes=kv_cache_bytes,
                               peak_kv_bytes=peak_kv_bytes, memory_kind=memory.kind)


class GenerationLoop:
    """Steps ``requests`` in lockstep until each has its tokens.

    ``forward(rows, feeds)``: one step of every row still in the batch (``feeds[r]``: row ``r``'s :data:`Feed`)
    → the step's last-column logits ``[rows, vocab]``; it keeps the cache's counters, and sets
    ``prompt_tokens`` of a row whose prompt the step ends (:attr:`Request.ending_prompt`).
    ``leave(rows)``: with ``rows_leave``, called after a step with the rows that finished (their requests'
    results are the caller's to make), before they leave the batch; without it, a finished row stays and is fed
    its greedy tokens (ignored) until every row has finished (a batch whose rows share one cache).
    """

    def __init__(self, requests: list[Request], eos: set[int], decode_evict: bool, memory: PeakMemory,
                 rows_leave: bool):
        self.rows, self.eos, self.decode_evict = list(requests), eos, decode_evict
        self.memory, self.rows_leave = memory, rows_leave
        self.t0 = time.perf_counter()
        #: the last step's greedy token of every row ``[rows]``, on the logits' device
        self.choice: torch.Tensor | None = None

    def run(self, forward: Callable[[list[Request], list[Feed]], torch.Tensor],
            leave: Callable[[list[int]], None]) -> None:
        while self.rows:
            feeds = [row.feed(self.decode_evict) for row in self.rows]
            logits = forward(self.rows, feeds)
            self.memory.sample()
            finished = self._choose(logits)
            if self.rows_leave and finished:
                leave(finished)
                self.rows = [row for r, row in enumerate(self.rows) if r not in finished]
            elif all(row.finished for row in self.rows):
                leave(list(range(len(self.rows))))
                self.rows = []

    def _choose(self, logits: torch.Tensor) -> list[int]:
        """The greedy token of each row past its prompt (``logits [rows, vocab]``) → the rows that finished now."""
        self.choice = logits.argmax(dim=-1)
        tokens = self.choice.tolist()  # the host needs them (eos); on CUDA this also waits for the device
        now = time.perf_counter()
        finished: list[int] = []
        for r, row in enumerate(self.rows):
            if row.prefilling:
                row.done_chunks += 1
                if row.prefilling:
                    continue
            tok = tokens[r]
            if row.finished:
                row.pending = tok
                continue
            if row.max_new == 0:  # no token taken: no time to first token
                row.t_first, row.finished, row.pending = now, True, tok
                finished.append(r)
                continue
            if row.taken == 0:
                row.t_first, row.ttft = now, now - self.t0
            if tok in self.eos or row.taken == row.max_new - 1:
                if tok not in self.eos:
                    row.out.append(tok)
                row.finished = True
                row.pending = tok
                finished.append(r)
                continue
            row.out.append(tok)
            row.taken += 1
            row.pending = tok
        return finished
