"""Conversations on one compressed context (kdeval/evals/task_run/conversation.py): a one-turn conversation is today's
single-question run, a multi-request turn is its question asked alone, the full cache's turn t is one pass over
the whole conversation, and a turn's rows are the same batched or alone and shared or alone."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.group_run import run_group
from kdeval.evals.task_run.runner import build_prompts, run_task
from kdeval.evals.task_run.settings import Conversation, RunSettings
from kdeval.evals.tasks.base import EvalError, Task
from kdeval.evals.tasks.prompting import PromptBuilder

#: row fields a run's timing or the way it was computed changes; the rest must be equal
TIMING = {"ttft_s", "decode_s", "timing_batch", "peak_memory_bytes", "shared_prefill_s", "kv_buffer_bytes", "execution",
          "replayed_steps", "peak_kv_bytes", "context_shared"}


@pytest.fixture(scope="module")
def lively():
    """llama-tiny in float64 with larger weights: its greedy tokens vary, so eviction shows in predictions."""
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def kv(turns: int = 2, repeats: int = 1):
    return get_task("turns.kv", lengths=[300], turns=turns, repeats=repeats, kind="numbers")


@dataclasses.dataclass
class OneQuestion(Task):
    """A multi-question task's samples asked as one-question samples (turn ``turn`` of each)."""

    inner: Task
    turn: int = 1

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def samples(self, builder=None):
        return [s.turn(self.turn) for s in self.inner.samples(builder) if s.turns >= self.turn]

    def score(self, prediction, references, meta):
        return self.inner.score(prediction, references, meta)


def same(a: dict, b: dict, skip=()) -> None:
    keys = (set(a) & set(b)) - TIMING - set(skip)
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.mark.parametrize("compress,chunk", [("prompt", 48), ("context", "whole")])
def test_one_turn_is_todays_single_question_run(lively, compress, chunk):
    task = kv(turns=1)
    conv = run_task(lively, task, RunSettings(policy="keydiff", budget=48, chunk_size=chunk, max_new_tokens=4,
                                              compress=compress))
    alone = run_task(lively, OneQuestion(task), RunSettings(policy="keydiff", budget=48, chunk_size=chunk,
                                                            max_new_tokens=4, compress=compress))
    assert [r["turn"] for r in conv] == [1] and "turn" not in alone[0]
    for c, a in zip(conv, alone):
        same(c, a)
        assert c["prediction"] == a["prediction"] and c["kept_tokens"] == a["kept_tokens"]


def test_multi_request_turn_is_its_question_asked_alone(lively):
    task, compress = kv(), "prompt"  # the context is prefilled to a chunk boundary, each question's tail from there
    rows = run_task(lively, task, RunSettings(policy="keydiff", budget=48, chunk_size=48, max_new_tokens=4,
                                              compress=compress, conversation={"mode": "multi-request"}))
    assert [(r["turn"], r["conversation"], r["answer_fed"]) for r in rows] == [
        (1, "multi-request", None), (2, "multi-request", None)]
    for t in (2,):
        alone = run_task(lively, OneQuestion(task, t), RunSettings(policy="keydiff", budget=48, chunk_size=48,
                                                                   max_new_tokens=4, compress=compress))
        for c, a in zip([r for r in rows if r["turn"] == t], alone):
            same(c, a, skip={"compressed_tokens"})
            assert c["prediction"] == a["prediction"]


def test_full_cache_turn_is_one_pass_over_the_whole_conversation(lively):
    """Chunked without eviction, turn 3 with golden answers fed back equals generating once from the whole
    conversation's tokens, built here by hand (no chat template: turns are joined by a blank line)."""
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig

    task = kv(turns=3)
    rows = run_task(lively, task, RunSettings(policy="full", chunk_size=48, max_new_tokens=5))
    builder = PromptBuilder(lively.tokenizer, lively.max_context)
    sample = task.samples(builder)[0]
    text_ids = builder.build(sample).ids
    for t in (2, 3):
        text_ids += builder.encode(sample.turn(t - 1).references[0] + "\n\n" + sample.turn(t).suffix.strip())
    engine = Engine(lively.model, get_policy("full"), EngineConfig(budget=None, chunk_size=len(text_ids)))
    res = engine.generate(torch.tensor([text_ids]), max_new_tokens=5, eos_token_id=lively.tokenizer.eos_token_id)
    row = rows[2]
    assert (row["id"], row["turn"], row["answer_fed"]) == (sample.id, 3, sample.turn(2).references[0])
    assert row["prompt_tokens"] == len(text_ids)
    assert row["prediction"] == builder.decode(res.tokens[0])


@pytest.mark.parametrize("compress,answers", [("prompt", "golden"), ("context", "own")])
def test_turn_rows_same_batched_or_alone_and_within_the_budget(lively, compress, answers):
    task = kv(repeats=2)
    settings = RunSettings(policy="keydiff", budget=48, chunk_size=48, max_new_tokens=3, compress=compress,
                           conversation={"mode": "multi-turn", "answers": answers})
    alone = run_task(lively, task, settings)
    batched = run_task(lively, task, dataclasses.replace(settings, batch_size=2))
    assert [(r["turn"], r["turns"]) for r in alone] == [(1, 2), (2, 2)] * 2
    for a, b in zip(alone, batched):
        same(a, b)
    for r in alone:
        if compress == "prompt":  # every turn's input is evicted to N chunk by chunk
            assert r["kept_tokens"] == 48 and r["peak_kv_tokens"] <= 48 + 48
    if answers == "own":
        assert [r["answer_fed"] for r in alone[:2]] == ["", alone[0]["prediction"]]
    else:
        assert alone[1]["answer_fed"] == alone[0]["references"][0]
    if compress == "context":  # the questions are kept on top of N, each turn's one more
        kept = [r["kept_tokens"] for r in alone[:2]]
        assert 48 < kept[0] < kept[1]


def test_shared_group_equals_each_cell_alone(lively):
    task = kv()
    prompts = build_prompts(task, PromptBuilder(lively.tokenizer, lively.max_context), max_new_tokens=4)
    members = [RunSettings(policy="keydiff", budget=48, chunk_size=48, max_new_tokens=4),
               RunSettings(policy="snapkv", budget=48, chunk_size=48, max_new_tokens=4,
                           conversation={"mode": "multi-request"})]
    grouped = run_group(lively, task, members, prompts, time_first=False)
    for m, got in zip(members, grouped):
        alone = run_task(lively, task, m, prompts=prompts)
        assert len(got.rows) == len(alone) == 2
        for a, b in zip(got.rows, alone):
            same(a, b)


def test_bad_conversations_are_refused(lively):
    needle = get_task("needle", lengths=[200], depths=[50], haystack="noise")
    with pytest.raises(EvalError, match="conversation: needle asks one question per context"):
        run_task(lively, needle, RunSettings(policy="keydiff", budget=48, conversation={"mode": "multi-turn"}))
    with pytest.raises(EvalError, match="conversation.mode: expected 'multi-turn' or 'multi-request', got 'chat'"):
        Conversation(mode="chat")
    with pytest.raises(EvalError, match="answers: 'own' needs mode 'multi-turn'"):
        Conversation(mode="multi-request", answers="own")
    with pytest.raises(EvalError, match="conversation: unknown field 'turns'"):
        Conversation.of({"turns": 2})


@pytest.mark.parametrize("mode,batch", [("multi-turn", 1), ("multi-request", 2)])
def test_each_turn_generates_its_own_length(lively, fixtures_dir, mode, batch):
    """SCBench's mixed tasks size each turn by its sub-task (summary 800, passkey 15), capped by the run's
    max_new_tokens: with 20, the turns may generate 20, 15 and 20 tokens."""
    task = get_task("scbench.summary_with_needles", data_dir=str(fixtures_dir))
    rows = run_task(lively, task, RunSettings(policy="keydiff", budget=48, chunk_size=32, max_new_tokens=20,
                                              batch_size=batch, conversation={"mode": mode}))
    assert [(r["turn"], r["generated_tokens"]) for r in rows] == [(1, 20), (2, 15), (3, 20)]


def test_a_conversation_longer_than_the_context_is_refused_before_it_runs(lively):
    """The check counts exactly what the turns feed: the last turn's prompt tokens plus its new tokens fit a
    context of that size and not one token less."""
    from kdeval.evals.task_run.conversation import TurnFrame, check_fits
    from kdeval.evals.tasks.base import ContextTooLongError
    from kdeval.zoo.loading import load_model

    task = kv(turns=3)
    rows = run_task(lively, task, RunSettings(policy="full", chunk_size=48, max_new_tokens=4))
    need = rows[-1]["prompt_tokens"] + 4
    assert need == max(r["prompt_tokens"] + 4 for r in rows)
    for ctx, fits in ((need, True), (need - 1, False)):
        builder = PromptBuilder(lively.tokenizer, ctx)
        sample = dataclasses.replace(task.samples(builder)[0], max_new_tokens=4)
        prompt = builder.build(sample)
        assert prompt.ids == builder.build(sample).ids and not prompt.truncated
        if fits:
            check_fits(sample, prompt, TurnFrame.of(builder, sample), builder, Conversation())
            check_fits(sample, prompt, TurnFrame.of(builder, sample), builder, Conversation(answers="own"))
        else:
            with pytest.raises(ContextTooLongError, match=f"needs at least {need} tokens by turn 3 of 3"):
                check_fits(sample, prompt, TurnFrame.of(builder, sample), builder, Conversation())
    short = load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1,
                                                                         "max_position_embeddings": need - 1})
    with pytest.raises(ContextTooLongError, match=r"turn 3 of 3 .* more than the model's context of "
                                                  rf"{need - 1}; ask fewer turns"):
        run_task(short, task, RunSettings(policy="full", chunk_size=48, max_new_tokens=4))
    assert len(run_task(short, kv(turns=2), RunSettings(policy="full", chunk_size=48,
                                                        max_new_tokens=4))) == 2  # two turns still fit
