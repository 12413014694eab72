"""Wrapper policies (AdaKV, ChunkKV) take a policy object: a grid or ``get_policy`` gives it as ``{name, params}``,
Python code as the object itself; its bad parameters get one line naming the nested field."""
from __future__ import annotations

import pytest

from kdeval.baselines import get_policy
from kdeval.baselines.snapkv import SnapKV
from kdeval.cluster import catalog
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.keydiff import Engine, EngineConfig

from tests.keydiff.helpers import kept_positions, prompt, tiny

NESTED = {"name": "snapkv", "params": {"pooling": "avg", "window": 8}}


@pytest.mark.parametrize("wrapper", ["ada", "chunkkv"])
def test_a_nested_inner_policy_is_built_with_its_parameters(wrapper):
    policy = get_policy(wrapper, inner=NESTED)
    assert isinstance(policy.wrapped, SnapKV) and (policy.wrapped.pooling, policy.wrapped.window) == ("avg", 8)
    by_object = get_policy(wrapper, inner=SnapKV(pooling="avg", window=8))
    by_name = get_policy(wrapper, inner="snapkv")  # the defaults: max pooling, window 32
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=2)
    runs = [Engine(lm.model, p, EngineConfig(budget=48, chunk_size=16)).generate(ids, max_new_tokens=4)
            for p in (policy, by_object, by_name)]
    nested, obj, default = (kept_positions(r.state) for r in runs)
    assert all(a.equal(b) for a, b in zip(nested, obj))
    assert not all(a.equal(b) for a, b in zip(nested, default))  # the parameters reached the inner policy


@pytest.mark.parametrize("inner, message", [
    ({"name": "snapkv", "params": {"pooling": "mean"}}, "inner.params.pooling: expected 'max' or 'avg', got 'mean'"),
    ({"name": "snapkv", "params": {"windw": 8}}, "inner.params.windw: unknown parameter for policy 'snapkv' "
                                                  "(did you mean 'window'?)"),
    ({"name": "snapkv", "extra": 1}, "inner: expected a policy name or {name: <policy>, params: {...}}"),
    ({"name": "snapvk"}, "inner: unknown policy 'snapvk' (did you mean 'snapkv'?)"),
])
def test_bad_nested_parameters_name_the_field(inner, message):
    with pytest.raises(ValueError) as info:
        get_policy("ada", inner=inner)
    assert str(info.value).startswith(message), str(info.value)


GRID = """
models: [random:llama-tiny]
policies: [{name: ada, params: {inner: INNER}}]
budgets: [64]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 1}]
"""


def test_a_grid_composes_policies_and_hashes_the_inner_policys_code():
    parse_grid(GRID.replace("INNER", "{name: snapkv, params: {pooling: avg}}"))
    with pytest.raises(GridError) as info:
        parse_grid(GRID.replace("INNER", "{name: snapkv, params: {pooling: mean}}"), "grid.yaml")
    assert "policies[0].params.inner.params.pooling: expected 'max' or 'avg', got 'mean'" in str(info.value)
    files = catalog.policy_source_files("ada", {"inner": {"name": "snapkv", "params": {"pooling": "avg"}}})
    assert files == ["baselines/adakv.py", "baselines/snapkv.py", "baselines/wrapping.py"]


@pytest.mark.parametrize("wrapper, inner, what", [
    ("criticalkv", "think", "edits its kept keys"),
    ("merging", "think", "edits its kept keys"),
    ("think", "merging", "merges values at eviction"),
    ("chunkkv", "merging", "merges values at eviction"),
])
def test_a_wrapper_that_would_drop_its_inner_policys_edit_is_refused(wrapper, inner, what):
    """ThinK's key edit and a merging policy's value merge are calls the engine makes on the outer policy: a
    wrapper that does not pass them on would run its inner policy without them, so it is refused, by name and
    as an object handed to the engine."""
    with pytest.raises(ValueError, match=f"^inner: policy '{wrapper}' cannot wrap a policy that {what}"):
        get_policy(wrapper, inner=inner)
    from kdeval.baselines.registry import policy_class

    outer = policy_class(wrapper)(inner=get_policy(inner))
    lm = tiny("random:llama-tiny", 1, "float32")
    with pytest.raises(ValueError, match=f"^policy: '{wrapper}' wraps a policy that {what}"):
        Engine(lm.model, outer, EngineConfig(budget=32, chunk_size=16)).prefill(prompt(64, seed=1))
