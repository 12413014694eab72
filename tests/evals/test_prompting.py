"""Prompt building: middle truncation, chat template or none, ids and hashes."""
from __future__ import annotations

import pytest

from kdeval.evals.tasks.base import ContextTooLongError, EvalError, Sample, prompt_hash
from kdeval.evals.tasks.prompting import PromptBuilder, middle_truncate


def _sample(prefix: str, suffix: str = "", max_new: int = 4, chat: bool = True, answer: str = "") -> Sample:
    return Sample(id="t/0", prefix=prefix, suffix=suffix, references=("x",), max_new_tokens=max_new,
                  use_chat_template=chat, answer_prefix=answer)


def test_middle_truncate_cut_inside_prefix():
    p, s, removed = middle_truncate(list(range(10)), [100, 101], 6)
    # keep first 3 and last 3 of [0..9, 100, 101]
    assert p + s == [0, 1, 2, 9, 100, 101]
    assert p == [0, 1, 2, 9] and s == [100, 101] and removed == 6


def test_middle_truncate_cut_inside_suffix():
    p, s, removed = middle_truncate([0, 1], list(range(100, 110)), 5)
    assert p + s == [0, 1, 100, 108, 109] and p == [0, 1] and removed == 7


def test_middle_truncate_cut_spanning_boundary():
    p, s, removed = middle_truncate([0, 1, 2, 3], [100, 101, 102, 103], 4)
    assert (p, s, removed) == ([0, 1], [102, 103], 4)


def test_middle_truncate_noop_when_it_fits():
    assert middle_truncate([1, 2], [3], 3) == ([1, 2], [3], 0)


def test_no_chat_template_adds_bos_and_answer_prefix(byte_tok):
    b = PromptBuilder(byte_tok, max_context=None)
    built = b.build(_sample("ab", "c", answer=" d"))
    assert built.prefix_ids == (1, ord("a") + 3, ord("b") + 3)
    assert built.suffix_ids == (ord("c") + 3, ord(" ") + 3, ord("d") + 3)
    assert not built.truncated and not built.used_chat_template
    assert built.hash == prompt_hash(built.ids) and len(built.hash) == 16


def test_chat_template_wraps_user_message_and_answer_prefix_follows(chat_tok):
    b = PromptBuilder(chat_tok, max_context=None)
    built = b.build(_sample("CTX", "Q", answer="A:"))
    text = chat_tok.decode(built.ids)
    assert text == "<user>CTXQ</user><assistant>A:"
    assert chat_tok.decode(built.prefix_ids) == "<user>CTX"
    assert built.used_chat_template


def test_sample_without_chat_template_gets_none_even_if_tokenizer_has_one(chat_tok):
    b = PromptBuilder(chat_tok, max_context=None)
    built = b.build(_sample("CTX", "Q", chat=False))
    assert chat_tok.decode(built.ids) == "CTXQ" and built.ids[0] == 1


def test_truncation_records_flag_and_fits_context(byte_tok):
    b = PromptBuilder(byte_tok, max_context=40)
    s = _sample("H" * 10 + "M" * 50 + "T" * 10, "?", max_new=4)
    built = b.build(s)
    assert built.truncated and built.n_tokens + 4 == 40
    text = byte_tok.decode(built.ids)
    assert text.startswith("HHHH") and text.endswith("TTTT?") and built.removed_tokens == 71 - 35


def test_context_too_small_is_a_clear_error(byte_tok):
    with pytest.raises(ContextTooLongError, match="max_context=10"):
        PromptBuilder(byte_tok, max_context=10).build(_sample("abc", max_new=8))


def test_sample_validation_names_the_field():
    with pytest.raises(EvalError, match="max_new_tokens"):
        Sample(id="a", prefix="", suffix="", references=("x",), max_new_tokens=0)
    with pytest.raises(EvalError, match="references"):
        Sample(id="a", prefix="", suffix="", references="x", max_new_tokens=1)  # type: ignore[arg-type]
