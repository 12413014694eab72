"""Wrapper policies (AdaKV, ChunkKV) take a policy object: a grid or ``get_policy`` gives it as ``{name, params}``,
Python code as the object itself; its bad parameters get one line naming the nested field."""
from __future__ import annotations

import pytest
import torch

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


def _cache(policy, ids):
    """Per layer, the kept (positions, keys, values) after a chunked prefill, each row in position order."""
    lm = tiny("random:llama-tiny", 2, "float64")
    state = Engine(lm.model, policy, EngineConfig(budget=48, chunk_size=16)).prefill(ids)
    out = []
    for layer in state.cache.layers:
        keys, positions, _ = layer.view()
        order = positions.argsort(dim=-1)
        pick = order.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        out.append((positions.gather(-1, order), keys.gather(2, pick), layer.values[:, :, : keys.shape[2]].gather(2, pick)))
    return out


@pytest.mark.parametrize("outer, inner, base, effect", [
    ("criticalkv", "think", "snapkv", "keys"),
    ("chunkkv", "think", "snapkv", "keys"),
    ("merging", "think", "knorm", "keys"),
    ("think", "merging", "knorm", "values"),
    ("chunkkv", "merging", "knorm", "values"),
    ("criticalkv", "merging", "snapkv", "values"),
])
def test_a_wrapper_passes_on_its_inner_policys_merge_or_key_edit(outer, inner, base, effect):
    """ThinK's key edit and a merging policy's value merge happen in the policy's commit hook (``apply``), which
    every wrapper passes on: ``outer(inner(base))`` leaves the cache that ``inner(outer(base))`` leaves (the same
    kept tokens, the same edit), and the edit shows against ``outer(base)`` alone (ThinK's zeroed key channels; merged
    values)."""
    ids = prompt(130, seed=2)
    nested = _cache(get_policy(outer, inner=get_policy(inner, inner=base)), ids)
    swapped = _cache(get_policy(inner, inner=get_policy(outer, inner=base)), ids)
    plain = _cache(get_policy(outer, inner=base), ids)
    for (pos, keys, values), (pos2, keys2, values2), (pos3, keys3, values3) in zip(nested, swapped, plain):
        assert torch.equal(pos, pos2) and torch.equal(keys, keys2) and torch.equal(values, values2)
        if effect == "keys":  # ThinK zeroed half of each head's key channels in every kept key
            zeroed = (keys == 0).all(dim=2).sum(dim=-1)  # [b, h]
            assert (zeroed == keys.shape[-1] // 2).all() and not (keys3 == 0).all(dim=2).any()
        else:
            assert not torch.equal(values, values3)
