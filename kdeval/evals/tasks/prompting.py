"""Prompt building: chat template (or none), tokenization, and middle truncation by tokens.

The user message is tokenized as two pieces, ``prefix`` (ends with the context) and ``suffix``
(the question), always separately, so a run that shares one compressed context between questions
and a run that does not see exactly the same token ids.

Final token layout (``ids = prefix_ids + suffix_ids``)::

    [special tokens | chat head] [user prefix] | [user suffix] [chat tail] [answer prefix]

Truncation follows LongBench: when the user message has more tokens than fit, keep its first
and last halves and drop the middle (``truncated`` records it). The limit is
``max_context - max_new_tokens - (template tokens)``, so prompt + generation always fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from kdeval.evals.tasks.base import ContextTooLongError, Sample, prompt_hash

_SENTINEL = "\u2063KDEVAL_USER_MESSAGE\u2063"


class TokenizerLike(Protocol):
    """The part of a Hugging Face tokenizer the builder uses."""

    chat_template: Any

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class BuiltPrompt:
    """A tokenized prompt: ``prefix_ids`` (shareable context part) and ``suffix_ids``."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    truncated: bool
    removed_tokens: int
    used_chat_template: bool

    @property
    def ids(self) -> list[int]:
        """All prompt token ids."""
        return list(self.prefix_ids) + list(self.suffix_ids)

    @property
    def n_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.prefix_ids) + len(self.suffix_ids)

    @property
    def hash(self) -> str:
        """Stable hash of the exact token ids."""
        return prompt_hash(self.ids)


def split_at_context(template: str, context: str, **fields: str) -> tuple[str, str]:
    """Fill a ``str.format`` template that has one ``{context}`` field and split it right after the
    context: (prefix ending with ``context``, suffix). ``context`` itself is never formatted."""
    head, tail = template.split("{context}", 1)
    return head.format(**fields) + context, tail.format(**fields)


def middle_truncate(prefix: list[int], suffix: list[int], limit: int) -> tuple[list[int], list[int], int]:
    """Keep the first ``limit - limit // 2`` and last ``limit // 2`` tokens of ``prefix + suffix``.

    Returns the new (prefix, suffix) split at the same boundary and the number of removed tokens.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    n = len(prefix) + len(suffix)
    if n <= limit:
        return list(prefix), list(suffix), 0
    head, tail = limit - limit // 2, limit // 2
    split = len(prefix)
    tail_start = n - tail
    if split <= head:  # the cut falls inside the suffix
        new_prefix = list(prefix)
        new_suffix = list(suffix[: head - split]) + list(suffix[len(suffix) - tail:] if tail else [])
    elif split >= tail_start:  # the cut falls inside the prefix
        keep_in_prefix_tail = split - tail_start
        new_prefix = list(prefix[:head]) + (list(prefix[split - keep_in_prefix_tail:]) if keep_in_prefix_tail else [])
        new_suffix = list(suffix)
    else:  # the cut spans the boundary
        new_prefix = list(prefix[:head])
        new_suffix = list(suffix[len(suffix) - tail:]) if tail else []
    return new_prefix, new_suffix, n - limit


class PromptBuilder:
    """Turns samples into token ids for one tokenizer and context size.

    Args:
        tokenizer: a Hugging Face tokenizer (or anything with ``encode``/``decode``/``chat_template``).
        max_context: the model's context length (tokens); None disables truncation.
        chat: ``"auto"`` (use the template when the tokenizer has one and the sample allows it),
            ``"never"``, or ``"always"`` (error when the tokenizer has none).
    """

    def __init__(self, tokenizer: TokenizerLike, max_context: int | None, chat: str = "auto") -> None:
        if chat not in ("auto", "never", "always"):
            raise ValueError(f"chat must be 'auto', 'never' or 'always', got {chat!r}")
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.chat = chat
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        if chat == "always" and not self.has_chat_template:
            raise ValueError("chat='always' but the tokenizer has no chat template")
        self._special_prefix = self._encode_special_prefix()
        self._chat_head, self._chat_tail = self._chat_pieces() if self.has_chat_template else ([], [])
        #: a system prompt -> the template's pieces around the user message after it
        self._system_pieces: dict[str, tuple[list[int], list[int]]] = {}

    # -- tokenizer plumbing -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens skipped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _encode_special_prefix(self) -> list[int]:
        """Special tokens the tokenizer puts before a text by default (e.g. BOS)."""
        try:
            with_special = list(self.tokenizer.encode("a", add_special_tokens=True))
            without = list(self.tokenizer.encode("a", add_special_tokens=False))
        except Exception:  # noqa: BLE001 - a tokenizer without add_special_tokens support
            return []
        if len(with_special) > len(without) and with_special[-len(without):] == without:
            return with_special[: len(with_special) - len(without)]
        return []

    def _chat_pieces(self, system: str = "") -> tuple[list[int], list[int]]:
        """Token ids the chat template puts before and after the user message (after ``system``'s message)."""
        messages = [{"role": "system", "content": system}] if system else []
        rendered = self.tokenizer.apply_chat_template(
            messages + [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
        )
        if _SENTINEL not in rendered:
            raise ValueError("the tokenizer's chat template does not contain the user message verbatim")
        head, tail = rendered.split(_SENTINEL, 1)
        # The template usually writes BOS as text; encode it as text so it maps to the special id.
        return self.encode(head), self.encode(tail)

    def uses_chat(self, sample: Sample) -> bool:
        """Whether ``sample`` gets the chat template with this builder."""
        if self.chat == "never" or not sample.use_chat_template:
            return False
        return self.has_chat_template

    # -- building -----------------------------------------------------------------------------
    def _frame(self, sample: Sample) -> tuple[bool, list[int], list[int], list[int]]:
        """(chat template used, ids before the user message, ids after it, answer prefix ids)."""
        chat = self.uses_chat(sample)
        head, tail = (self._chat_head, self._chat_tail) if chat else (self._special_prefix, [])
        if sample.system and chat:
            if sample.system not in self._system_pieces:
                self._system_pieces[sample.system] = self._chat_pieces(sample.system)
            head, tail = self._system_pieces[sample.system]
        elif sample.system:  # no template: the system prompt leads the text
            head = head + self.encode(sample.system + "\n\n")
        return chat, head, tail, self.encode(sample.answer_prefix)

    def overhead(self, sample: Sample) -> int:
        """Tokens the prompt has besides the user message (template, answer prefix)."""
        _, head, tail, answer = self._frame(sample)
        return len(head) + len(tail) + len(answer)

    def count_besides_prefix(self, sample: Sample) -> int:
        """Untruncated prompt tokens of ``sample`` other than its ``prefix`` (the question and the frame):
        compares samples that share a context without tokenizing the context."""
        return self.overhead(sample) + len(self.encode(sample.suffix))

    def count(self, sample: Sample) -> int:
        """Untruncated prompt tokens of ``sample``."""
        return len(self.encode(sample.prefix)) + self.count_besides_prefix(sample)

    def build(self, sample: Sample) -> BuiltPrompt:
        """Tokenize ``sample`` and truncate its user message in the middle when needed."""
        chat, head, tail, answer = self._frame(sample)
        prefix, suffix = self.encode(sample.prefix), self.encode(sample.suffix)
        removed = 0
        if self.max_context is not None:
            limit = self.max_context - sample.max_new_tokens - len(head) - len(tail) - len(answer)
            if limit < 16:
                raise ContextTooLongError(
                    f"max_context={self.max_context} leaves {limit} tokens for the prompt of sample "
                    f"{sample.id!r} (max_new_tokens={sample.max_new_tokens}); expected at least 16"
                )
            prefix, suffix, removed = middle_truncate(prefix, suffix, limit)
        return BuiltPrompt(
            prefix_ids=tuple(head + prefix),
            suffix_ids=tuple(suffix + tail + answer),
            truncated=removed > 0,
            removed_tokens=removed,
            used_chat_template=chat,
        )
