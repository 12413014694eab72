"""Several questions on one compressed context: multi-turn conversations and multi-request runs.

A sample of a task with several questions per context (``Task.multi_question``) holds turn 1's question in
``suffix`` and the later ones in ``followups``. Two modes (:class:`Conversation`):

- **multi-turn** (SCBench's protocol): the context is compressed once, query-aware (``compress="prompt"``: the
  context and turn 1's question in one chunked pass, evicting) or query-agnostic (``"context"``: the context
  alone; the question is fed after it without eviction and protected). Each later turn feeds, to the cache the
  earlier turns left, the previous answer (``answers="golden"``: the reference, SCBench's default; ``"own"``:
  the model's generated tokens), the chat template's turn change and its question; then it decodes and is
  scored. What a turn feeds follows the protocol's decode rule and the budget: under ``decode="evict"`` it is
  fed in chunks of ``B`` with eviction to ``N`` (under ``"context"`` its question is fed without eviction and
  protected, as turn 1's); under ``"keep"`` nothing is evicted after the first compression.
- **multi-request** (SCBench's ``scdq``, kvpress's multi-question pipeline): every question is asked from the
  same compressed context as a first question would be; the cache is not updated between them.

A turn's answer is decoded from a fork of the conversation's cache; the conversation itself then continues
by feeding the turn's input (and, at the next turn, the answer fed back) as prompt steps, one sample at a
time. So a conversation's cache never depends on how its turns were batched, and a turn's rows are the same
at any batch size (the engine's ``generate_batch`` equals each request alone). The price: each turn's input is
computed twice (for the answer and for the conversation), which for ``chunk_size="whole"`` under
``compress="prompt"`` is the whole first prompt.

Turn 1 is today's single-question run exactly: under ``"prompt"`` the context is prefilled up to the last
chunk boundary before the prompt's end, and the rest goes through ``generate``, so the chunks are those of one
pass over the whole prompt; under ``"context"`` the context is prefilled and the question fed protected.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kdeval.evals.task_run.rows import result_row
from kdeval.evals.task_run.settings import Conversation
from kdeval.evals.task_run.stores import Stores, sharing
from kdeval.evals.tasks.base import ContextTooLongError, EvalError, Sample, Task
from kdeval.evals.tasks.prompting import BuiltPrompt, PromptBuilder

_USER = "\u2063KDEVAL_TURN_{}\u2063"


@dataclass(frozen=True)
class TurnFrame:
    """The token ids around a later turn's user message for one builder and sample: ``between`` (after an
    answer, before the next user message) and ``after`` (after it: the template's assistant header and the
    sample's answer prefix). Without a chat template a turn is ``"\\n\\n" + question + answer prefix``."""

    between: tuple[int, ...]
    after: tuple[int, ...]

    @classmethod
    def of(cls, builder: PromptBuilder, sample: Sample) -> "TurnFrame":
        answer_prefix = builder.encode(sample.answer_prefix)
        if not builder.uses_chat(sample):
            return cls(tuple(builder.encode("\n\n")), tuple(answer_prefix))
        marks = [_USER.format(i) for i in range(3)]
        text = builder.tokenizer.apply_chat_template(
            [{"role": "user", "content": marks[0]}, {"role": "assistant", "content": marks[1]},
             {"role": "user", "content": marks[2]}], tokenize=False, add_generation_prompt=True)
        if not all(m in text for m in marks):
            raise EvalError("conversation: the tokenizer's chat template does not keep a conversation's messages "
                            "verbatim; multi-turn runs need one that does")
        between = text.split(marks[1], 1)[1].split(marks[2], 1)[0]
        after = text.split(marks[2], 1)[1]
        return cls(tuple(builder.encode(between)), tuple(builder.encode(after)) + tuple(answer_prefix))


@dataclass
class _Dialogue:
    """One sample's conversation: its turns, the cache the earlier turns left and what was fed to it."""

    sample: Sample
    prompt: BuiltPrompt          # turn 1's prompt
    frame: TurnFrame
    turn_prompts: list[BuiltPrompt]  # multi-request: each turn's whole prompt
    cut: int                     # turn-1 prompt tokens prefilled before the first turn
    start: Any = None            # PrefillState the next turn continues (None: nothing fed yet)
    fed: list[int] = field(default_factory=list)
    start_s: float = 0.0         # seconds of the context prefill before turn 1
    answer_ids: list[int] = field(default_factory=list)  # the answer fed back at the next turn
    answer_text: str = ""


def conversation_prompts(builder: PromptBuilder, sample: Sample, prompt: BuiltPrompt,
                         conv: Conversation) -> list[BuiltPrompt]:
    """Multi-request: each turn's prompt (the context and that turn's question, as a first question); the
    context's tokens must be turn 1's (no truncation that differs per question)."""
    if conv.mode != "multi-request":
        return [prompt]
    out = [prompt]
    for t in range(2, sample.turns + 1):
        p = builder.build(sample.turn(t))
        if p.prefix_ids != prompt.prefix_ids:
            raise ContextTooLongError(f"sample {sample.id!r}: its context was truncated differently for question "
                                      f"{t}; a multi-request run needs one context for every question (a model "
                                      f"with a longer context, or a shorter length)")
        out.append(p)
    return out


def run_conversations(eng: Any, task: Task, samples: Sequence[Sample], built: Sequence[BuiltPrompt],
                      builder: PromptBuilder, conv: Conversation, *, context_only: bool, decode_evict: bool,
                      eos: Any, device: Any, weight_bytes: int, strip: tuple[str, str] | None,
                      batch_size: int, stores: Stores | None = None) -> list[list[dict[str, Any]]]:
    """The rows of each sample (one per turn, in turn order) of a conversation run on one engine. ``stores``
    (at batch 1): each sample's id to the store of its context, read by every engine call on that sample."""
    B = eng.config.chunk_size
    talks = []
    for s, p in zip(samples, built):
        prompts = conversation_prompts(builder, s, p, conv)
        if context_only:
            cut = len(p.prefix_ids)
        elif conv.mode == "multi-request":
            cut = (len(p.prefix_ids) // B) * B  # a chunk boundary every question's prompt has
        else:
            cut = ((p.n_tokens - 1) // B) * B  # the chunks of one pass over the whole prompt
        talks.append(_Dialogue(s, p, TurnFrame.of(builder, s), prompts, cut))
    if conv.mode == "multi-turn" and builder.max_context is not None:
        for d in talks:
            check_fits(d.sample, d.prompt, d.frame, builder, conv)
    for d in talks:
        if d.cut:
            t0 = time.perf_counter()
            with sharing(eng, stores, d.sample.id):
                d.start = eng.prefill(torch.tensor([d.prompt.ids[: d.cut]], device=device))
            d.start_s, d.fed = time.perf_counter() - t0, d.prompt.ids[: d.cut]
    rows: list[list[dict[str, Any]]] = [[] for _ in talks]
    timing = 0
    for t in range(1, max(s.turns for s in samples) + 1):
        active = [i for i, s in enumerate(samples) if s.turns >= t]
        feeds = {i: _feed(talks[i], t, conv, builder, context_only, decode_evict) for i in active}
        for k in range(0, len(active), batch_size):
            part = active[k : k + batch_size]
            with sharing(eng, stores, samples[part[0]].id):  # stores: at batch 1 only, one sample per part
                results = _decode(eng, [talks[i] for i in part], [feeds[i] for i in part], t, eos, device,
                                  decode_evict)
            for i, res in zip(part, results):
                rows[i].append(_row(task, talks[i], t, feeds[i], res, conv, builder, eng, context_only, strip,
                                    weight_bytes, timing))
            timing += 1
        for i in active:
            d = talks[i]
            if conv.mode == "multi-turn" and t < d.sample.turns:
                with sharing(eng, stores, d.sample.id):
                    d.start = _advance(eng, d.start, *feeds[i], device)
                d.fed = d.fed + list(feeds[i][0])
    for d in talks:
        if d.start is not None:
            eng.release(d.start)
    return rows


def check_fits(sample: Sample, prompt: BuiltPrompt, frame: TurnFrame, builder: PromptBuilder,
               conv: Conversation) -> None:
    """Refuse, before anything runs, a multi-turn conversation that cannot fit the model's context: by some turn
    the tokens fed (the first prompt, then each turn's answer fed back and question) and that turn's new tokens
    exceed it. With ``answers="own"`` the answers are not known yet and count as empty, so only conversations
    that fail whatever the model says are refused."""
    total = len(prompt.ids)
    for t in range(1, sample.turns + 1):
        if t > 1:
            turn = sample.turn(t)
            answer = "" if conv.answers == "own" else _spaced(sample.answer_prefix, golden_answer(sample.turn(t - 1)))
            total += (len(builder.encode(answer)) if answer else 0) + len(frame.between) + len(frame.after)
            total += len(builder.encode(turn.suffix.strip()))
        if total + sample.new_tokens(t) > builder.max_context:  # type: ignore[operator]
            raise ContextTooLongError(
                f"sample {sample.id!r}: its conversation needs at least {total + sample.new_tokens(t)} tokens by "
                f"turn {t} of {sample.turns} (the first prompt, the answers fed back and the questions, and turn "
                f"{t}'s {sample.new_tokens(t)} new tokens), more than the model's context of {builder.max_context}; "
                f"ask fewer turns (the task's turns or max_turns) or use a model with a longer context")


def _feed(d: _Dialogue, t: int, conv: Conversation, builder: PromptBuilder, context_only: bool,
          decode_evict: bool) -> tuple[list[int], int]:
    """Turn ``t``'s input after the conversation's cache and how many of its last tokens are protected (fed
    without eviction, never evicted)."""
    if conv.mode == "multi-request":
        p = d.turn_prompts[t - 1]
        return p.ids[d.cut :], len(p.suffix_ids) if context_only else 0
    if t == 1:
        return d.prompt.ids[d.cut :], len(d.prompt.suffix_ids) if context_only else 0
    question = list(builder.encode(d.sample.turn(t).suffix.strip())) + list(d.frame.after)
    ids = list(d.answer_ids) + list(d.frame.between) + question
    if not decode_evict:
        return ids, len(ids)
    return ids, len(question) if context_only else 0


def _decode(eng: Any, talks: Sequence[_Dialogue], feeds: Sequence[tuple[list[int], int]], t: int, eos: Any,
            device: Any, decode_evict: bool) -> list[Any]:
    """Each dialogue's turn ``t`` answered from (a fork of) its cache: one ``generate`` alone, or one
    ``generate_batch`` (which reads the states and leaves them as they are)."""
    max_new = [d.sample.new_tokens(t) for d in talks]
    if len(talks) > 1:
        return eng.generate_batch([f[0] for f in feeds], max_new_tokens=max_new, eos_token_id=eos,
                                  states=[d.start for d in talks], protect_last=[f[1] for f in feeds],
                                  decode_evict=decode_evict)
    (d,), ((ids, protect),) = talks, feeds
    fork = d.start.fork() if d.start is not None else None
    res = eng.generate(torch.tensor([ids], device=device), max_new_tokens=max_new[0], eos_token_id=eos,
                       state=fork, protect_last=protect, decode_evict=decode_evict)
    eng.release(res.state)
    return [res]


def _advance(eng: Any, state: Any, ids: list[int], protect: int, device: Any) -> Any:
    """``state`` after ``ids`` fed as prompt steps: the same chunks ``generate`` feeds them in (the unprotected
    part evicting, then the last ``protect`` tokens without eviction, protected)."""
    if not ids:
        return state
    return eng.prefill(torch.tensor([ids], device=device), state=state, protect_last=protect)


def _row(task: Task, d: _Dialogue, t: int, feed: tuple[list[int], int], res: Any, conv: Conversation,
         builder: PromptBuilder, eng: Any, context_only: bool, strip: tuple[str, str] | None, weight_bytes: int,
         timing: int) -> dict[str, Any]:
    """Turn ``t``'s scored row, and what the next turn feeds back (kept on ``d``)."""
    gen = res.tokens[0]
    text = builder.decode(gen)
    turn = d.sample.turn(t)
    before = d.fed if conv.mode == "multi-turn" else d.prompt.ids[: d.cut]
    fed = dataclasses.replace(d.prompt, prefix_ids=tuple(before), suffix_ids=tuple(feed[0]))
    row = result_row(task, turn, fed, text, len(gen), res.stats.to_dict(), d.start is not None, d.start_s,
                     weight_bytes, eng.config.budget if eng.plan.evicting else None, eng.config.chunk_size,
                     "context" if context_only else "prompt", strip, timing_batch=timing)
    row["compressed_tokens"] = len(d.prompt.prefix_ids) if context_only else d.prompt.n_tokens
    row.update(turn=t, turns=d.sample.turns, question=turn.suffix.strip(), conversation=conv.label,
               answer_fed=d.answer_text if conv.mode == "multi-turn" else None)
    if conv.mode == "multi-turn":
        if conv.answers == "own":
            d.answer_ids, d.answer_text = list(gen), text
        else:
            d.answer_text = golden_answer(turn)
            d.answer_ids = list(builder.encode(_spaced(turn.answer_prefix, d.answer_text)))
    return row


def golden_answer(turn: Sample) -> str:
    """The reference fed back after a turn: its first reference."""
    return turn.references[0]


def _spaced(answer_prefix: str, answer: str) -> str:
    """The answer as it continues the answer prefix (a space between words)."""
    return " " + answer if answer_prefix and not answer_prefix[-1].isspace() and not answer[:1].isspace() else answer
