"""RunSettings: a cell's settings as one value, checked when made; run_task needs a batch size; the shared store of
each sample's context is set on the engine only around that context's calls (run/stores.py)."""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals import RunSettings
from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.runner import run_task
from kdeval.evals.task_run.settings import Conversation
from kdeval.evals.task_run.stores import sharing
from kdeval.evals.tasks.base import EvalError


@pytest.mark.parametrize("fields,message", [
    (dict(compress="question"), "compress: expected 'prompt', 'context' or 'generated', got 'question'"),
    (dict(decode="drop"), "decode: expected 'evict' or 'keep'"),
    (dict(thinking="hide"), "thinking: expected 'keep' or 'strip'"),
    (dict(max_new_tokens=0), "max_new_tokens: expected a positive integer or None"),
    (dict(batch_size=0), "batch_size: expected a positive integer"),
    (dict(batch_size=True), "batch_size: expected a positive integer, got True"),
    (dict(engine={"graph_runner": None}), "engine: unknown option 'graph_runner'"),
    (dict(conversation={"turns": 2}), "conversation: unknown field 'turns'"),
    (dict(policy=object(), policy_params={"window": 4}), "policy_params: only allowed with a policy name"),
])
def test_bad_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(EvalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunSettings(**fields)


def test_settings_are_one_frozen_value_with_the_conversation_resolved():
    s = RunSettings(policy="snapkv", budget="25%", compress="context", conversation={"mode": "multi-request"})
    assert s.conversation == Conversation(mode="multi-request") and s.context_only and s.decode_evict
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.budget = 64  # type: ignore[misc]
    assert dataclasses.replace(s, batch_size=None).batch_size is None  # a group's member: the group chooses
    assert s.policy_object().name == "snapkv"


def test_run_task_needs_a_batch_size_before_anything_runs():
    task = get_task("needle", lengths=[600], depths=[50], haystack="noise")
    with pytest.raises(EvalError, match="batch_size: expected a positive integer, got None"):
        run_task(None, task, RunSettings(batch_size=None))  # refused before the model is read


def test_sharing_sets_the_store_of_one_sample_and_clears_it():
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from tests.keydiff.helpers import tiny

    eng = Engine(tiny().model, get_policy("keydiff"), EngineConfig(budget=32, chunk_size=16))
    store = object()
    with sharing(eng, {"a": store}, "a") as got:
        assert got is store and eng.shared is store
    assert eng.shared is None
    with pytest.raises(KeyError):
        with sharing(eng, {"a": store}, "b"):
            pass
    with sharing(eng, None, "b"):
        assert eng.shared is None
    with pytest.raises(RuntimeError):
        with sharing(eng, {"a": store}, "a"):
            raise RuntimeError("a failed call")
    assert eng.shared is None
