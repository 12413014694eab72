"""Phonebook: sizes, shared context per book, exact-match scoring."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.phonebook import PhonebookTask, first_phone
from kdeval.evals.tasks.base import EvalError
from kdeval.evals.tasks.prompting import PromptBuilder


def test_books_fit_and_questions_share_the_book(byte_tok):
    builder = PromptBuilder(byte_tok, 4096)
    task = PhonebookTask(lengths=(800,), num_books=2, questions_per_book=3)
    samples = task.samples(builder)
    assert [s.id for s in samples][:3] == ["phonebook/L800/b0/q0", "phonebook/L800/b0/q1", "phonebook/L800/b0/q2"]
    assert len({s.prefix for s in samples[:3]}) == 1 and samples[0].prefix != samples[3].prefix
    for s in samples:
        total = builder.count(s) + s.max_new_tokens
        assert 800 - 40 < total <= 800  # one entry is ~30 bytes
        name = s.suffix.split("phone number of ")[1].rstrip("?")
        assert f"{name}: {s.references[0]}\n" in s.prefix + "\n"
    assert [s.meta["depth"] for s in samples[:3]][0] < samples[2].meta["depth"]
    assert [s.prefix for s in task.samples(builder)] == [s.prefix for s in samples]


def test_exact_match():
    task = PhonebookTask()
    assert first_phone("call 555-123-4567 or 555-000-0000") == "555-123-4567"
    assert task.score(" 555-123-4567.", ["555-123-4567"], {}).score == 1.0
    assert task.score("555-000-0000 or 555-123-4567", ["555-123-4567"], {}).score == 0.0
    assert task.score("5551234567", ["555-123-4567"], {}).score == 0.0
    assert task.aggregate([{"score": 1.0, "length": 800}, {"score": 0.0, "length": 800}])["accuracy"] == 50.0
    with pytest.raises(EvalError, match="questions_per_book"):
        PhonebookTask(questions_per_book=0)
