"""RunSettings(batch_size=...): the same rows as one sample at a time, shared contexts included.

float64 llama-tiny with larger weights (its greedy tokens vary and eviction shows in them): every column but
the timings and the process / buffer memory figures is equal, for both protocols and both decode modes; the KV
bytes a row holds by its own tokens (``peak_kv_bytes``) included.
"""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.runner import run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import EvalError

#: what depends on the batch: wall-clock times, the process memory and the K/V buffers allocated for the batch
BATCH_DEPENDENT = {"ttft_s", "decode_s", "shared_prefill_s", "peak_memory_bytes", "kv_buffer_bytes", "timing_batch"}


@pytest.fixture(scope="module")
def lively():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def same_rows(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert set(g) == set(r)
        assert {k: v for k, v in g.items() if k not in BATCH_DEPENDENT} == \
            {k: v for k, v in r.items() if k not in BATCH_DEPENDENT}, g["id"]
        assert g["peak_kv_bytes"] > 0


TASKS = {
    # prompts of different lengths, one sample each
    "ruler": lambda: get_task("ruler.niah_single_1", lengths=[700, 900], num_samples=3),
    # three questions per book: contexts shared by groups that straddle batches
    "phonebook": lambda: get_task("phonebook", lengths=[400], num_books=2, questions_per_book=3, max_new_tokens=8),
}


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("policy,compress,decode", [("keydiff", "prompt", "evict"), ("keydiff", "context", "keep"),
                                                    ("snapkv", "prompt", "evict"), ("h2o", "context", "evict")])
def test_batched_rows_equal_one_at_a_time(lively, task, policy, compress, decode):
    t = TASKS[task]()
    settings = RunSettings(policy=policy, budget=64, chunk_size=32, compress=compress, decode=decode, max_new_tokens=10)
    ref = run_task(lively, t, settings)
    got = run_task(lively, t, dataclasses.replace(settings, batch_size=4))
    same_rows(got, ref)
    # one timing per generate call: batch 1 times every row apart; the rows of a batch name their batch
    assert sorted(r["timing_batch"] for r in ref) == list(range(len(ref)))
    batches = [r["timing_batch"] for r in got]
    assert batches == sorted(batches) and max(batches) + 1 == -(-len(got) // 4)
    if task == "phonebook":
        assert all(r["context_shared"] for r in got)
    assert len({r["generated_tokens"] for r in ref} | {r["prompt_tokens"] for r in ref}) > 2


def test_batch_larger_than_the_task_and_unshared_contexts(lively):
    t = TASKS["phonebook"]()
    ref = run_task(lively, t, RunSettings(policy="keydiff", budget=64, chunk_size=32, share_context=False))
    same_rows(run_task(lively, t, RunSettings(policy="keydiff", budget=64, chunk_size=32, share_context=False,
                                              batch_size=16)), ref)
    assert not any(r["context_shared"] for r in ref)


def test_graph_path_engine_runs_batches_eagerly(lively, captured_steps, emulated_graphs):
    """An engine on the (emulated) graph path prefills shared contexts with its graphs; batched questions
    run eagerly and give the same rows as that engine one sample at a time."""
    t = TASKS["phonebook"]()
    static = {"cuda_graphs": True}
    ref = run_task(lively, t, RunSettings(policy="keydiff", budget=64, chunk_size=32, engine=static))
    made = len(captured_steps)
    got = run_task(lively, t, RunSettings(policy="keydiff", budget=64, chunk_size=32, engine=static, batch_size=3))
    same_rows(got, ref)
    assert made > 0 and len(captured_steps) > made  # the shared contexts' prefill still captures its steps


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True])
def test_batch_size_must_be_a_positive_integer(lively, bad):
    with pytest.raises(EvalError, match=r"^batch_size: expected a positive integer, got "):
        run_task(lively, TASKS["ruler"](), RunSettings(policy="keydiff", budget=64, batch_size=bad))


@pytest.mark.slow
def test_smollm2_batched_tokens_and_kept_sets(smollm2, data_dir):
    """SmolLM2 in float32: the same tokens and kept sets in a batch of 4 as one at a time; last prompt logits
    within 1e-4 (observed: ~3e-5)."""
    import torch

    from kdeval.baselines import get_policy
    from kdeval.evals.task_run.runner import model_prompts
    from kdeval.keydiff import Engine, EngineConfig

    task = get_task("needle", lengths=[512], depths=[10, 40, 70, 100], data_dir=str(data_dir))
    _, built = model_prompts(smollm2, task, max_new_tokens=16)
    for policy in ("keydiff", "snapkv"):
        eng = Engine(smollm2.model, get_policy(policy), EngineConfig(budget=128, chunk_size=64))
        got = eng.generate_batch([p.ids for p in built], max_new_tokens=16, eos_token_id=smollm2.eos_token_ids)
        for p, g in zip(built, got):
            r = eng.generate(torch.tensor([p.ids]), max_new_tokens=16, eos_token_id=smollm2.eos_token_ids)
            assert g.tokens == r.tokens
            for a, b in zip(g.state.cache.layers, r.state.cache.layers):
                assert torch.equal(a.view()[1].sort(dim=-1).values, b.view()[1].sort(dim=-1).values)
            assert torch.allclose(g.state.last_logits, r.state.last_logits, rtol=0, atol=1e-4)
