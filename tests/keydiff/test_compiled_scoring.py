"""``compile_scoring``: the graph path's scoring through torch.compile keeps what the plain scoring keeps."""
import pytest
import torch

from kdeval.baselines import get_policy

from .helpers import assert_same_run, make_engine, prompt, tiny


def _engine(lm, policy, compiled, fused=False):
    return make_engine(lm.model, get_policy(policy), budget=40, chunk_size=16, cuda_graphs=True, emulate_graphs=True,
                       fuse_layers=fused, compile_scoring=compiled)


@pytest.mark.parametrize("policy, fused", [("keydiff", False), ("keydiff", True), ("snapkv", False),
                                           ("h2o", True)])
def test_compiled_scoring_keeps_the_same_tokens(policy, fused):
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=21)
    torch._dynamo.utils.counters.clear()
    plain = _engine(lm, policy, False, fused)
    compiled = _engine(lm, policy, True, fused)
    assert compiled.compiled_scoring and not plain.compiled_scoring
    ref, got = plain.generate(ids, max_new_tokens=6), compiled.generate(ids, max_new_tokens=6)
    assert_same_run(got, ref, atol=1e-9, rtol=0)
    assert torch._dynamo.utils.counters["frames"]["ok"] + torch._dynamo.utils.counters["frames"]["total"] > 0


def test_compile_scoring_only_applies_to_the_graph_path():
    lm = tiny()
    eng = make_engine(lm.model, get_policy("keydiff"), budget=40, chunk_size=16, compile_scoring=True)
    assert not eng.use_graphs and not eng.compiled_scoring


@pytest.mark.parametrize("policy", ["keydiff", "h2o"])
def test_compiled_blocks_keep_the_same_tokens_and_leave_the_model_as_it_was(policy):
    from transformers.models.llama import modeling_llama

    from kdeval.keydiff import blocks

    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=22)
    rope = modeling_llama.apply_rotary_pos_emb
    cfg = dict(budget=40, chunk_size=16, cuda_graphs=True, emulate_graphs=True)
    ref = make_engine(lm.model, get_policy(policy), **cfg).generate(ids, max_new_tokens=6)
    eng = make_engine(lm.model, get_policy(policy), **cfg, compile_blocks=True)
    routed = []  # during the step the final norm's forward is the compiled call
    hook = lm.model.model.norm.register_forward_pre_hook(lambda m, args: routed.append(m.__dict__.get("forward")))
    try:
        got = eng.generate(ids, max_new_tokens=6)
    finally:
        hook.remove()
    assert routed and all(f is not None and f.func is blocks._compiled_call() for f in routed)
    assert_same_run(got, ref, atol=1e-6)  # float32 steps fused away
    assert modeling_llama.apply_rotary_pos_emb is rope
    assert all("forward" not in m.__dict__ for m in lm.model.modules())
    assert len(eng._blocks.modules) == 3 * lm.model.config.num_hidden_layers + 1  # 2 norms + MLP per layer, final norm


def test_compiled_parts_keep_compiling_past_dynamos_default_limit():
    """A worker meets one shape per policy x budget x chunk x model: the 9th must still be compiled, not run
    uncompiled after dynamo's default of 8 recompiles."""
    from torch._dynamo.utils import counters

    from kdeval.keydiff.compiling import compile_fn

    def double(x):
        return x * 2

    compiled = compile_fn(double, backend="eager", dynamic=False)
    before = counters["frames"]["ok"]
    for n in range(1, 13):
        assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 2.0))
    assert counters["frames"]["ok"] - before == 12
