"""Which attention function runs is decided once, by the plan: score-only policies run under the model's own
attention (SDPA or eager here; flash-attn has no CPU kernel), on the graph path emulated too; policies that read
attention rows, keep per-layer budgets or share a layer's slots among heads need the engine's SDPA functions and
are refused with that reason, by the engine and at grid validation."""
from __future__ import annotations

import functools

import pytest

from kdeval.baselines import get_policy, policy_names
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model
from kdeval.keydiff.plan.plan import own_attention_reason

from .helpers import assert_same_run, kept_positions, prompt
from .oracles import EMULATED

CONFIG = dict(budget=40, chunk_size=16)


def _own_attention(name: str) -> str | None:
    policy = get_policy(name)
    return own_attention_reason(policy.needs(), len(set(policy.layer_budgets(40, 2))) > 1)


SCORE_ONLY = [n for n in policy_names() if get_policy(n).evicts and _own_attention(n) is None]
NEEDS_SDPA = [n for n in policy_names() if get_policy(n).evicts and _own_attention(n) is not None]


@functools.lru_cache(maxsize=None)
def model(impl: str):
    return load_model("random:llama-tiny", device="cpu", dtype="float64", attn_implementation=impl,
                      overrides={"num_key_value_heads": 2}).model


def test_the_lists_cover_both_kinds():
    assert {"keydiff", "knorm", "sink"} <= set(SCORE_ONLY)
    assert {"snapkv", "tova", "h2o", "pyramidkv", "ada-keydiff"} <= set(NEEDS_SDPA)


@pytest.mark.parametrize("policy", SCORE_ONLY)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_score_only_policies_run_under_every_cpu_implementation_on_the_graph_path(policy, impl):
    """Asked for graphs (emulated), an SDPA model takes the static layout (unless the policy keeps it off) and an
    eager model runs eagerly under its own attention, saying why; both keep what the dynamic slot store keeps
    under SDPA."""
    ids = prompt(90, seed=5)
    graphs = Engine(model(impl), get_policy(policy), EngineConfig(**CONFIG, cuda_graphs=True), **EMULATED)
    off = graphs.plan.graphs_off or ""
    assert graphs.plan.use_graphs == (off == "")  # a query window, re-rotation, ... also keep graphs off
    assert ("the model uses 'eager'" in off) == (impl == "eager")
    got = graphs.generate(ids, max_new_tokens=6)
    ref = Engine(model("sdpa"), get_policy(policy), EngineConfig(**CONFIG)).generate(ids, max_new_tokens=6)
    assert_same_run(got, ref, atol=1e-9 if impl == "sdpa" else 1e-6)  # eager's softmax runs in float32
    if impl == "eager":  # the same run as the same model's without graphs asked for
        alone = Engine(model(impl), get_policy(policy), EngineConfig(**CONFIG)).generate(ids, max_new_tokens=6)
        assert_same_run(got, alone, atol=0)
    assert kept_positions(got.state)[0].shape[-1] == 40


@pytest.mark.parametrize("policy", NEEDS_SDPA)
@pytest.mark.parametrize("graphs", [None, True])
def test_policies_that_need_the_engines_sdpa_are_refused_on_an_eager_model(policy, graphs):
    with pytest.raises(ValueError) as info:
        Engine(model("eager"), get_policy(policy), EngineConfig(**CONFIG, cuda_graphs=graphs), **EMULATED)
    msg = str(info.value)
    assert msg.startswith(f"attn_implementation: policy '{policy}' ") and "the model uses 'eager'" in msg
    assert _own_attention(policy) in msg


GRID = """
models: [{id: random:llama-tiny, attn_implementation: IMPL}]
policies: [POLICY]
budgets: [64]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 1}]
"""


@pytest.mark.parametrize("impl", ["eager", "flash_attention_2"])
def test_the_grid_refuses_what_the_engine_refuses_with_the_same_reason(impl):
    parse_grid(GRID.replace("IMPL", impl).replace("POLICY", "keydiff"))  # score-only: accepted
    with pytest.raises(GridError) as info:
        parse_grid(GRID.replace("IMPL", impl).replace("POLICY", "snapkv"), "grid.yaml")
    assert (f"models[0].attn_implementation: policies[0] 'snapkv' {_own_attention('snapkv')}; use "
            f"attn_implementation: sdpa for it") in str(info.value), str(info.value)


def test_a_batch_on_a_model_without_sdpa_is_refused_at_validation():
    with pytest.raises(GridError) as info:
        parse_grid(GRID.replace("IMPL", "eager").replace("POLICY", "keydiff") + "generation: {batch_size: 4}\n")
    assert ("generation.batch_size: a batch of requests runs on SDPA with a padding mask; models[0] uses 'eager' "
            "(set batch_size: 1 or attn_implementation: sdpa)") in str(info.value)
