"""run_task's protocols (compress, decode), its KV-cache memory columns and the generation-length override."""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.runner import aggregate, build_prompts, model_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import EvalError, Sample, ScoreResult, Task
from kdeval.evals.tasks.prompting import PromptBuilder


@pytest.fixture(scope="module")
def tiny():
    """llama-tiny, float32: it repeats one token and never emits eos, so every run generates max_new_tokens."""
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny")


@pytest.fixture(scope="module")
def lively():
    """llama-tiny in float64 with larger weights: its greedy tokens vary, so eviction shows in predictions."""
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


PER_TOKEN = 3 * 2 * 16 * 2 * 4  # llama-tiny float32: layers x kv_heads x head_dim x (K and V) x itemsize


def phonebook(max_new_tokens: int = 6):
    return get_task("phonebook", lengths=[500], num_books=1, questions_per_book=2, max_new_tokens=max_new_tokens)


def test_defaults_are_the_papers_protocol_as_before(lively):
    """Predictions recorded before the protocols existed (shared and separate contexts differ: the prompt
    protocol chunks the question with the context when they are fed together)."""
    task = phonebook()
    shared = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32))
    alone = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, share_context=False))
    assert [r["prediction"] for r in shared] == ["\ufffd" * 6, "\ufffd0\ufffd\ufffd\ufffd\ufffd"]
    assert [r["prediction"] for r in alone] == ["\ufffdz\ufffd\ufffd\ufffd\ufffd", "\ufffd\x05=\ufffd\x1c\x1c"]
    explicit = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress="prompt",
                                                  decode="evict"))
    assert [r["prediction"] for r in explicit] == [r["prediction"] for r in shared]


def test_context_protocol_keeps_the_question_and_shares_exactly(tiny, lively):
    """compress="context": the cache ends at the budget plus the question; a shared context and separate
    prompts are then the same computation (the question starts its own chunk either way)."""
    task = phonebook()
    samples, prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, tiny.max_context))
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress="context"))
    for row, p in zip(rows, prompts):
        assert row["context_shared"] and len(p.prefix_ids) > 64 + 32
        assert row["kept_tokens"] == 64 + len(p.suffix_ids)
        assert row["peak_kv_tokens"] == max(64 + 32, 64 + len(p.suffix_ids) + 1)
    shared = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress="context"))
    alone = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress="context",
                                               share_context=False))
    assert [r["prediction"] for r in shared] == [r["prediction"] for r in alone]
    prompt_protocol = run_task(lively, task, RunSettings(policy="keydiff", budget=64, chunk_size=32))
    assert [r["prediction"] for r in shared] != [r["prediction"] for r in prompt_protocol]


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_decode_keep_grows_the_cache_by_the_generated_tokens(tiny, compress):
    task = phonebook(max_new_tokens=8)
    _, prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, tiny.max_context))
    keep = run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress=compress,
                                            decode="keep"))
    evict = run_task(tiny, task, RunSettings(policy="keydiff", budget=64, chunk_size=32, compress=compress))
    for k, e, p in zip(keep, evict, prompts):
        after_prompt = 64 + (len(p.suffix_ids) if compress == "context" else 0)
        assert k["generated_tokens"] == e["generated_tokens"] == 8
        assert k["kept_tokens"] == after_prompt + 8 - 1 and e["kept_tokens"] == after_prompt


def test_graph_path_under_context_protocol_reuses_its_captured_steps(captured_steps, emulated_graphs):
    """Emulated graphs under compress="context": the predictions of the default path, and the static cache
    thawed for each question goes back to the pool, so later requests capture nothing."""
    from kdeval.zoo.loading import load_model

    lm = load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})
    made = captured_steps
    task = get_task("needle", lengths=[600], depths=[0, 50, 100], haystack="noise", max_new_tokens=4)
    static = {"cuda_graphs": True}
    run = RunSettings(policy="keydiff", budget=128, chunk_size=64, compress="context")
    first = run_task(lm, task, dataclasses.replace(run, engine=static), limit=1)
    per_request = len(made)
    rows = run_task(lm, task, dataclasses.replace(run, engine=static))
    assert per_request >= 2 and len(made) == 2 * per_request
    plain = run_task(lm, task, run)
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in plain]
    assert rows[0]["prediction"] == first[0]["prediction"]


@dataclasses.dataclass
class NoQuestion(Task):
    """A task whose samples are all context (nothing to protect)."""

    name: str = "noquestion"

    def samples(self, builder=None):
        return [Sample(id="q0", prefix="a long context " * 20, suffix="", references=("x",), max_new_tokens=2)]

    def score(self, prediction, references, meta):
        return ScoreResult(0.0)


def test_protocol_values_and_a_task_without_a_question_refused(tiny, data_dir):
    task = phonebook()
    with pytest.raises(EvalError,
                       match=r"^compress: expected 'prompt', 'context' or 'generated', got 'question'$"):
        run_task(tiny, task, RunSettings(policy="keydiff", budget=64, compress="question"))
    with pytest.raises(EvalError, match=r"^decode: expected 'evict' or 'keep', got 'drop'$"):
        run_task(tiny, task, RunSettings(policy="keydiff", budget=64, decode="drop"))
    with pytest.raises(EvalError, match=r"^protocol\.compress: 'context' needs a task with a separable question; "
                                        r"noquestion has none \(sample 'q0' has an empty question\)$"):
        run_task(tiny, NoQuestion(), RunSettings(policy="keydiff", budget=64, compress="context"))
    assert len(run_task(tiny, NoQuestion(), RunSettings(policy="keydiff",
                                                        budget=64))) == 1  # the prompt protocol needs none
    math = get_task("math500", data_dir=str(data_dir), limit=1, max_new_tokens=2)  # its question is its problem
    with pytest.raises(EvalError, match=r"^protocol\.compress: 'context' needs a task with a separable question; "
                                        r"math500 has none \(its prompt is all question\)$"):
        run_task(tiny, math, RunSettings(policy="keydiff", budget=64, compress="context"))


def test_rows_carry_kv_bytes_memory_kind_and_weights(tiny):
    """keydiff at N=128, B=64 holds N + B tokens at its peak whatever the length; the full cache its prompt and
    all but the last generated token; the summary adds the KV peak and the weights."""
    from kdeval.keydiff.loop.memory import model_weight_bytes

    kv, full = {}, {}
    for length in (600, 900):
        task = get_task("needle", lengths=[length], depths=[50], haystack="noise", max_new_tokens=4)
        _, prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, tiny.max_context))
        [row] = run_task(tiny, task, RunSettings(policy="keydiff", budget=128, chunk_size=64))
        [frow] = run_task(tiny, task, RunSettings(policy="full", chunk_size=64))
        assert row["memory_kind"] == frow["memory_kind"] == "process_rss"
        assert row["model_weight_bytes"] == model_weight_bytes(tiny.model) > 0
        kv[length] = row["peak_kv_bytes"]
        full[length] = frow["peak_kv_bytes"]
        assert full[length] == (prompts[0].n_tokens + 4 - 1) * PER_TOKEN
        summary = aggregate(task, [row])
        assert summary["max_peak_kv_bytes"] == row["peak_kv_bytes"]
        assert summary["model_weight_bytes"] == row["model_weight_bytes"]
        assert summary["max_peak_memory_bytes"] == row["peak_memory_bytes"] > row["model_weight_bytes"]
    assert kv[600] == kv[900] == (128 + 64) * PER_TOKEN
    assert full[900] > full[600] > kv[600]


def test_max_new_tokens_override(tiny, fixtures_dir):
    """LongBench hotpotqa (official 32 new tokens) run with max_new_tokens=3: at most 3 per sample, and the
    prompts are truncated for 3, not 32."""
    task = get_task("longbench.hotpotqa", data_dir=str(fixtures_dir), limit=2)
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, max_new_tokens=3))
    assert len(rows) == 2 and all(0 < r["generated_tokens"] <= 3 for r in rows)
    official, official_prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, 300))
    short, short_prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, 300), max_new_tokens=3)
    assert {s.max_new_tokens for s in official} == {32} and {s.max_new_tokens for s in short} == {3}
    assert [s.id for s in short] == [s.id for s in official]
    for a, b in zip(official_prompts, short_prompts):
        assert a.truncated and a.removed_tokens - b.removed_tokens == 32 - 3
    with pytest.raises(EvalError, match=r"^max_new_tokens: the prompts were built for sample .* 32 new tokens, "
                                        r"not 3; build them with model_prompts\(\.\.\., max_new_tokens=3\)$"):
        run_task(tiny, task, RunSettings(policy="keydiff", budget=128, max_new_tokens=3), prompts=model_prompts(tiny,
                                                                                                                task))
    prebuilt = model_prompts(tiny, task, max_new_tokens=3)
    again = run_task(tiny, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, max_new_tokens=3),
                     prompts=prebuilt)
    assert [r["prediction"] for r in again] == [r["prediction"] for r in rows]
    with pytest.raises(EvalError, match=r"^max_new_tokens: expected a positive integer or None, got 0$"):
        run_task(tiny, task, RunSettings(policy="keydiff", budget=128, max_new_tokens=0))
