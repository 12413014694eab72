"""The static-buffer step that CUDA graphs capture gives the plain path's tokens, kept sets and logits.

On CPU the path runs emulated (same static buffers, a tensor ``seen``, plain calls instead of replays);
bench/gpu_check.py checks the real graphs on a GPU.
"""
import pytest
import torch

from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff import Engine, EngineConfig

from .helpers import kept_positions, prompt, tiny

GRAPH_SAFE = [n for n in policy_names() if n != "full" and get_policy(n).graph_safe]


@pytest.mark.parametrize("policy", GRAPH_SAFE)
def test_emulated_graph_step_equals_plain(policy):
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=9)
    results = []
    for graphs in (False, True):
        used = []
        eng = Engine(lm.model, get_policy(policy),
                     EngineConfig(budget=40, chunk_size=16, cuda_graphs=graphs, emulate_graphs=graphs),
                     on_step=lambda s: used.append(len(s.cache.graphs)))
        results.append((eng.generate(ids, max_new_tokens=8), used))
    (plain, _), (graph, used) = results
    assert used[-1] == 2  # one captured step for full chunks, one for decoding
    assert plain.tokens == graph.tokens
    for a, b in zip(kept_positions(plain.state), kept_positions(graph.state)):
        assert torch.equal(a, b)
    assert torch.allclose(plain.state.last_logits, graph.state.last_logits, atol=1e-9)


def test_graphs_refused_without_cuda():
    with pytest.raises(ValueError, match=r"cuda_graphs: needs a CUDA device"):
        Engine(tiny().model, get_policy("keydiff"), EngineConfig(budget=40, cuda_graphs=True))


def test_random_policy_never_captured():
    lm = tiny()
    eng = Engine(lm.model, get_policy("random"), EngineConfig(budget=40, chunk_size=16, cuda_graphs=True, emulate_graphs=True))
    assert not eng.use_graphs
    res = eng.generate(prompt(100), max_new_tokens=4)
    assert res.state.cache.graphs == {}
