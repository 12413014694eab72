"""A repeat pass (KVzip's context reconstruction): what a policy asks for, the prompt, and how a step's chunk is cut.

A policy with a :class:`RepeatNeed` (``PolicyNeeds.repeat``) is scored by a second forward after each evicting prompt
step: the model is fed a *repeat prompt* (an instruction to repeat the context, the chat template's end of the user
turn and start of the answer, then the step's chunk again) over the cache as the step left it, and each cached token
of the chunk is scored by the attention the repeated tokens pay it (kdeval/keydiff/step/repeat_pass.py). The repeat's
keys and values are never written into the cache.

A step's chunk (positions ``p0 .. p0 + t - 1``) is reconstructed in pieces of at most ``RepeatNeed.chunk`` tokens
(:func:`pieces`). A chunk that starts the prompt with the chat template's head (:attr:`RepeatPrompt.head`: the
system prompt and the user turn's header) is not reconstructed there: those tokens score 0, as in kvpress. The
first piece of a prompt follows the instruction :attr:`RepeatPrompt.first`; every later one (a later piece of the
same chunk, or a later chunk of a chunked prefill) follows :attr:`RepeatPrompt.later` and the ``postfix`` tokens fed
just before it ("... starting with <those tokens>").

This module imports torch only (policies declare a :class:`RepeatNeed` where grids are validated).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: kvpress' (and the KVzip paper's) instructions before the first piece and before each later one
FIRST = "\n\nRepeat the previous context exactly."
LATER = "\n\nRepeat the part of the previous context exactly, starting with"


@dataclass(frozen=True)
class RepeatNeed:
    """What a policy's repeat pass computes: the softmax of each repeated query over the first ``n_sink`` positions,
    the piece being reconstructed and the repeat's own tokens (causal); pieces of at most ``chunk`` tokens; a later
    piece's instruction ends with the ``postfix`` tokens before it."""

    n_sink: int = 4
    chunk: int = 2048
    postfix: int = 8


@dataclass(frozen=True)
class RepeatPrompt:
    """The token ids a repeat pass is built from (:meth:`from_tokenizer`); the default, all empty, feeds the chunk
    again with no instruction or template (random test models without a chat template or vocabulary)."""

    #: the chat template's tokens before the user message (a prompt that starts with them does not reconstruct them)
    head: tuple[int, ...] = ()
    #: the instruction before the first piece of a prompt
    first: tuple[int, ...] = ()
    #: the instruction before a later piece (followed by the ``postfix`` tokens fed before the piece)
    later: tuple[int, ...] = ()
    #: the chat template's tokens after the user message, the answer's header included (no template: ``"\n"``)
    suffix: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "RepeatPrompt":
        """The repeat prompt of a Hugging Face tokenizer, as kvpress' ``KVzipPress`` builds it: its chat template
        rendered around a placeholder user message (thinking off) and split there; without a template, no head and
        a newline after the message."""
        def encode(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()

        head_text, suffix_text = "", "\n"
        if getattr(tokenizer, "chat_template", None):
            placeholder, separator = "kdeval context", "\n" + "#" * 14
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": placeholder + separator}],
                                                     add_generation_prompt=True, tokenize=False, enable_thinking=False)
            before, suffix_text = rendered.split(separator, 1)
            head_text = before.split(placeholder, 1)[0]
        return cls(head=encode(head_text), first=encode(FIRST), later=encode(LATER), suffix=encode(suffix_text))


@dataclass
class RepeatProgress:
    """A request's progress through its repeat passes, kept in its ``PrefillState`` (one entry per batch row)."""

    #: tokens of each row reconstructed so far (0: the next piece is the prompt's first)
    done: list[int]
    #: ``[rows, <= postfix]``: the last token ids fed to each row (the text a later piece starts after)
    tail: torch.Tensor

    def copy(self) -> "RepeatProgress":
        return RepeatProgress(list(self.done), self.tail.clone())

    def fed(self, ids: torch.Tensor, postfix: int) -> None:
        """Record the step's ids ``[rows, t]`` as fed."""
        self.tail = torch.cat([self.tail, ids.to(self.tail.device)], dim=1)[:, -postfix:]


@dataclass(frozen=True)
class Piece:
    """One repeat forward of one row: ``ids [q]`` (instruction, suffix, then the chunk's columns ``[a, e)``),
    reconstructing positions ``p0 + a .. p0 + e - 1``; its softmax sees the first ``sinks`` positions."""

    ids: torch.Tensor
    a: int
    e: int
    sinks: int


def _ids(values: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def pieces(prompt: RepeatPrompt, need: RepeatNeed, ids: torch.Tensor, p0: int, done: int,
           before: torch.Tensor) -> list[Piece]:
    """The repeat forwards of one row's chunk ``ids [t]`` at positions ``p0 ..``: ``done`` tokens of the row were
    reconstructed before, ``before [<= postfix]`` are the ids fed just before the chunk (module docstring)."""
    t, h = ids.shape[0], len(prompt.head)
    skip = h if p0 == 0 and 0 < h <= t and ids[:h].tolist() == list(prompt.head) else 0
    out, suffix = [], _ids(prompt.suffix, ids)
    for a in range(skip, t, need.chunk):
        e = min(a + need.chunk, t)
        if done == 0:
            instruction = _ids(prompt.first, ids)
        else:
            instruction = torch.cat([_ids(prompt.later, ids), torch.cat([before, ids[:a]])[-need.postfix:]])
        out.append(Piece(torch.cat([instruction, suffix, ids[a:e]]), a, e, min(need.n_sink, p0 + a)))
        done += e - a
    return out


@dataclass
class RepeatInput:
    """What a step hands its repeat pass: the step's ids ``[rows, t]``, its first position ``p0``, the tokens seen
    after it, and each row's pieces."""

    ids: torch.Tensor
    p0: int
    seen_after: int
    rows: list[list[Piece]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens of the repeat forwards, per row (a batch's rows: the most of any row)."""
        return max((sum(p.ids.shape[0] for p in row) for row in self.rows), default=0)
