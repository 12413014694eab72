"""Reasoning models: the thinking block a model writes before its answer, removed before scoring.

R1-style models (DeepSeek-R1 distills, Qwen3, QwQ) write ``<think> ... </think>`` and then the answer; some
chat templates open the block in the generation prompt, so the output holds only the closing marker. With
``generation: {thinking: strip}`` the text after the last closing marker is scored; an output that opened a
block and never closed it (it ran out of tokens while thinking) has no answer (``""``). The raw output stays
in the row's ``prediction``; the scored text is the row's ``answer``.

Markers are the model's own when its tokenizer declares them (an added token or its chat template), else
``<think>`` / ``</think>``.
"""
from __future__ import annotations

from typing import Any

from kdeval.evals.tasks.base import check_choice

#: ``generation.thinking`` values: ``keep`` scores the whole output, ``strip`` removes the thinking block.
THINKING_MODES = ("keep", "strip")
DEFAULT_MARKERS = ("<think>", "</think>")
#: (open, close) pairs reasoning models declare, in the order they are looked for.
KNOWN_MARKERS = (("<think>", "</think>"), ("<thinking>", "</thinking>"), ("<|begin_of_thought|>", "<|end_of_thought|>"))


def thinking_markers(tokenizer: Any) -> tuple[str, str]:
    """The (open, close) thinking markers ``tokenizer`` declares as added tokens or in its chat template,
    else :data:`DEFAULT_MARKERS`."""
    declared = ""
    try:
        declared = " ".join(tokenizer.get_added_vocab())
    except Exception:  # noqa: BLE001 - a tokenizer without added-vocabulary support
        pass
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        declared += " " + template
    for pair in KNOWN_MARKERS:
        if pair[1] in declared:
            return pair
    return DEFAULT_MARKERS


def strip_thinking(text: str, markers: tuple[str, str] = DEFAULT_MARKERS) -> str:
    """``text`` after its last closing marker (stripped of surrounding whitespace); ``""`` when a block was
    opened and never closed; ``text`` unchanged when it has neither marker."""
    open_, close = markers
    if close in text:
        return text.rsplit(close, 1)[1].strip()
    if open_ in text:
        return ""
    return text


def scored_text(text: str, mode: str, markers: tuple[str, str] = DEFAULT_MARKERS) -> str:
    """What is scored of a generation under ``generation.thinking`` ``mode``."""
    check_choice("generation.thinking", mode, THINKING_MODES)
    return strip_thinking(text, markers) if mode == "strip" else text
