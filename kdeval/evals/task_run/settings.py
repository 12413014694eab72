"""A cell's run settings as one value: what :func:`~kdeval.evals.task_run.runner.run_task` runs a task with.

    settings = RunSettings(policy="keydiff", budget=256, chunk_size=64, compress="context")
    rows = run_task(lm, task, settings)

Every field is checked when the value is made (errors name the field, :class:`~kdeval.evals.tasks.base.EvalError`);
what depends on the task (a conversation for a one-question task, a question for ``compress="context"``) is
checked by ``run_task``. Which samples run, prebuilt prompts and shared stores are ``run_task``'s own arguments:
they say what a call runs on, not how a cell runs.

Also here: how a task with several questions per context asks them (:class:`Conversation`), part of a cell's
identity. Importing this module does not import torch.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Mapping

from kdeval.evals.task_run.budget import Budget
from kdeval.evals.task_run.chunking import ChunkSize
from kdeval.evals.tasks.base import EvalError, Task, check_choice, check_positive
from kdeval.evals.tasks.thinking import THINKING_MODES

#: ``EngineConfig`` fields a run does not set through ``engine``: budget and chunk size are settings of their
#: own, and each sample sets its generation length.
NOT_ENGINE_OPTIONS = frozenset({"budget", "chunk_size", "max_new_tokens"})

#: What is compressed: every chunk of the whole prompt, the context only (the question is kept), or the
#: generated tokens only (the whole prompt is kept: reasoning traces, R-KV's protocol).
COMPRESS = ("prompt", "context", "generated")
#: Whether eviction continues after every generated token.
DECODE = ("evict", "keep")

#: How the questions of a context are asked.
MODES = ("multi-turn", "multi-request")
#: What a multi-turn conversation feeds back after each turn: the reference answer or the model's own.
ANSWERS = ("golden", "own")


@functools.cache
def engine_options() -> tuple[str, ...]:
    """The ``EngineConfig`` options a run may set (its fields but :data:`NOT_ENGINE_OPTIONS`), e.g.
    ``cuda_graphs``.

    Lazy: the engine's settings are read where grids are validated, and the run side is also imported for
    :func:`~kdeval.evals.task_run.runner.aggregate` alone.
    """
    from kdeval.keydiff.config import EngineConfig

    return tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name not in NOT_ENGINE_OPTIONS)


@dataclass(frozen=True)
class Conversation:
    """How a task's several questions per context run (part of a cell's identity;
    :mod:`kdeval.evals.task_run.conversation` runs them)."""

    mode: str = "multi-turn"
    answers: str = "golden"

    def __post_init__(self) -> None:
        check_choice("conversation.mode", self.mode, MODES)
        check_choice("conversation.answers", self.answers, ANSWERS)
        if self.mode == "multi-request" and self.answers != "golden":
            raise EvalError("conversation.answers: 'own' needs mode 'multi-turn' (a multi-request turn feeds no "
                            "answer back)")

    @property
    def label(self) -> str:
        """``multi-turn/golden``, ``multi-turn/own`` or ``multi-request`` (the rows' ``conversation``)."""
        return self.mode if self.mode == "multi-request" else f"{self.mode}/{self.answers}"

    @classmethod
    def of(cls, value: "Conversation | Mapping[str, Any] | None") -> "Conversation | None":
        if value is None or isinstance(value, Conversation):
            return value
        unknown = sorted(set(value) - {"mode", "answers"})
        if unknown:
            raise EvalError(f"conversation: unknown field {unknown[0]!r}; expected mode, answers")
        return cls(**dict(value))


def resolve_conversation(task: Task, conversation: Any) -> Conversation | None:
    """The conversation a run of ``task`` uses: the given one, multi-turn with golden answers for a task with
    several questions per context when none is given, None for a one-question task (which refuses one)."""
    conv = Conversation.of(conversation)
    if not task.multi_question:
        if conv is not None:
            raise EvalError(f"conversation: {task.name} asks one question per context; multi-turn and "
                            f"multi-request runs need a task with several (turns.kv, turns.needles, "
                            f"turns.loogle.*, scbench.*)")
        return None
    return conv or Conversation()


@dataclass(frozen=True)
class RunSettings:
    """How one cell runs a task.

    Attributes:
        policy: a policy name for ``kdeval.baselines.get_policy`` or a policy object.
        policy_params: parameters for a policy given by name.
        budget: KV budget: N tokens, a share of each sample's prompt such as ``"25%"`` (resolved per sample,
            :mod:`kdeval.evals.task_run.budget`; rows record the N in ``resolved_budget``), or None (no eviction).
        chunk_size: prefill chunk size B, or ``"whole"``: one chunk per sample holding all that is compressed
            (:mod:`kdeval.evals.task_run.chunking`; rows record the B in ``resolved_chunk``).
        compress: ``"prompt"`` (every chunk of the whole prompt is evicted to the budget), ``"context"``
            (the context is; the question is then fed without eviction and never evicted: the cache holds the
            budget plus the question) or ``"generated"`` (the whole prompt is fed without eviction and never
            evicted; from the first generated token on eviction chooses among generated tokens only: the cache
            holds the prompt plus the budget, a share being one of each sample's ``max_new_tokens``). Under
            ``"context"`` every sample needs a non-empty question; ``"generated"`` needs ``decode="evict"``
            and a policy that scores generated tokens (:func:`generated_refusal`).
        decode: ``"evict"`` (after every generated token; under ``"context"`` the question stays) or
            ``"keep"`` (no eviction after the prompt: the cache grows by one token per generated token).
        max_new_tokens: every sample's generation length (the prompts are built for it; prebuilt prompts must
            have been); None: each sample's own.
        batch_size: samples sent through the engine together (``Engine.generate_batch``, eager: no CUDA
            graphs); the rows are the same as with 1 (tokens and kept sets; timings and memory are the
            batch's, ``kv_buffer_bytes`` too; ``peak_kv_bytes`` the row's own tokens', as at batch 1). A shared
            context is still prefilled once, at batch 1, and its questions are rows continuing from it. None:
            chosen by :func:`~kdeval.evals.task_run.group_run.run_group` (``run_task`` needs a number).
        thinking: ``"keep"`` (score the whole generation) or ``"strip"`` (score what follows the thinking block,
            markers from the tokenizer; :mod:`kdeval.evals.tasks.thinking`): rows keep the raw ``prediction``
            and add the scored ``answer``.
        conversation: how a task with several questions per context asks them (a :class:`Conversation` or
            its fields; held as a :class:`Conversation`); None: multi-turn with golden answers for such a
            task. A one-question task refuses one.
        chat: ``"auto"`` / ``"never"`` / ``"always"`` chat-template use (see ``PromptBuilder``).
        share_context: compress a shared context once for consecutive questions on it.
        engine: ``EngineConfig`` options, some of :func:`engine_options`, e.g. ``{"score_precision": "float32"}``.
    """

    policy: Any = "keydiff"
    policy_params: Mapping[str, Any] | None = None
    budget: Budget = None
    chunk_size: ChunkSize = 128
    compress: str = "prompt"
    decode: str = "evict"
    max_new_tokens: int | None = None
    batch_size: int | None = 1
    thinking: str = "keep"
    conversation: Conversation | None = None
    chat: str = "auto"
    share_context: bool = True
    engine: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_choice("compress", self.compress, COMPRESS)
        check_choice("decode", self.decode, DECODE)
        check_choice("thinking", self.thinking, THINKING_MODES)
        check_positive("max_new_tokens", self.max_new_tokens, allow_none=True)
        if self.batch_size is not None:
            check_batch_size(self.batch_size)
        object.__setattr__(self, "conversation", Conversation.of(self.conversation))
        unknown = sorted(set(self.engine or {}) - set(engine_options()))
        if unknown:
            raise EvalError(f"engine: unknown option {unknown[0]!r}; expected some of {list(engine_options())}")
        if not isinstance(self.policy, str) and self.policy_params:
            raise EvalError("policy_params: only allowed with a policy name, not a policy object")
        if self.compress == "generated" and self.decode != "evict":
            raise EvalError("protocol.decode: 'keep' under compress 'generated' evicts nothing at all (the "
                            "prompt is kept and so would every generated token be); use decode 'evict'")

    @property
    def context_only(self) -> bool:
        """Whether only the context is compressed (``compress="context"``)."""
        return self.compress == "context"

    @property
    def prompt_kept(self) -> bool:
        """Whether the whole prompt is kept, only generated tokens evicted (``compress="generated"``)."""
        return self.compress == "generated"

    @property
    def decode_evict(self) -> bool:
        """Whether eviction continues while decoding (``decode="evict"``)."""
        return self.decode == "evict"

    def with_policy_object(self) -> "RunSettings":
        """These settings with the policy resolved to its object (built once, e.g. for a group's members)."""
        return dataclasses.replace(self, policy=self.policy_object(), policy_params=None)

    def policy_object(self) -> Any:
        """The policy object: ``kdeval.baselines.get_policy(policy, **policy_params)`` for a name, else
        ``policy`` itself."""
        if isinstance(self.policy, str):
            from kdeval.baselines import get_policy

            return get_policy(self.policy, **dict(self.policy_params or {}))
        return self.policy


def protected_tokens(compress: str, prompt: Any, fed: int) -> int:
    """How many of the last ``fed`` tokens of ``prompt`` (a ``BuiltPrompt``, its whole ids or, after a shared
    context, its question) a call feeds without eviction and protects: the question under ``"context"``, all
    of them under ``"generated"``, none under ``"prompt"``."""
    if compress == "context":
        return len(prompt.suffix_ids)
    return fed if compress == "generated" else 0


def generated_refusal(needs: Any) -> str | None:
    """Why a policy of ``needs`` (``PolicyNeeds``) cannot run under ``compress="generated"``, or ``None``: a
    policy that scores tokens only by a repeat pass after evicting prompt steps (KVzip) has no score for a
    generated token."""
    if needs.repeat is not None:
        return ("scores tokens by a repeat pass after evicting prompt steps, which generated tokens never "
                "get; it cannot run under compress 'generated'")
    return None


def check_batch_size(batch_size: Any) -> None:
    """Refuse a batch size that is not a positive integer."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise EvalError(f"batch_size: expected a positive integer, got {batch_size!r}")
    check_positive("batch_size", batch_size)
