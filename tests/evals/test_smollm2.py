"""SmolLM2-135M with the full cache: needle and RULER niah_single_1 at ~1.5K tokens score above chance.

One prompt each: a 1.5K-token prefill takes ~10 s on two shared CPU cores.
"""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.runner import aggregate, run_task
from kdeval.evals.task_run.settings import RunSettings


@pytest.mark.slow
def test_needle_and_niah_above_chance(smollm2, data_dir):
    needle = get_task("needle", lengths=[1536], depths=[90], data_dir=str(data_dir), max_new_tokens=16)
    rows = run_task(smollm2, needle, RunSettings(policy="full", budget=None, chunk_size=512))
    assert all(r["chat_template"] and 1400 <= r["prompt_tokens"] + 16 <= 1536 for r in rows)
    # chance: a 7-word-plus phrase never appears at random; ROUGE-L recall of unrelated text is ~0.1
    assert aggregate(needle, rows)["rouge_l_recall"] >= 50.0

    niah = get_task("ruler.niah_single_1", lengths=[1536], num_samples=1)
    rows = run_task(smollm2, niah, RunSettings(policy="full", budget=None, chunk_size=512))
    # chance of writing a random 7-digit number is ~1e-7
    assert aggregate(niah, rows)["score"] >= 50.0
