"""A policy that reads values and the layer's projections gets them in every cache layout, from its own declaration
alone: the policy below is all there is (its file plus a registry line, here a fixture)."""
from dataclasses import dataclass

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register, unregister
from kdeval.keydiff.step.shared import SharedSteps

from .helpers import assert_same_run, capture_hidden_states, make_engine, prompt, tiny
from .oracles import EMULATED, GATHER


HIDDEN: dict[int, torch.Tensor] | None = None


@dataclass
class ValuesThroughWo(Policy):
    """Keep the tokens whose values ``W_o`` maps furthest: reads values and projections, no attention rows. While
    ``HIDDEN`` is a dict (a test's capture of each layer's attention input), it also keeps each step's hidden
    states from it, to check the values it is handed against ``v_proj`` of them."""

    name = "test-values-through-wo"
    rule = "keep the tokens with the largest |W_o v| (a test policy)"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.seen: list[tuple] = []  # per observed layer: (ctx, the step's values, its hidden states), copied

    def needs(self) -> PolicyNeeds:
        return PolicyNeeds(values=True, projections=True)

    def observe(self, ctx: ScoreContext) -> None:
        if HIDDEN is not None:
            self.seen.append((ctx, ctx.values[:, :, -ctx.n_new :].clone(), HIDDEN[ctx.layer_idx].clone()))

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → ``[b, h, n]``: ``|W_o[:, head h's first query head] v|`` plus a small ``|W_q^T k|``
        term (the projections read once more)."""
        proj, d = ctx.projections, ctx.projections.head_dim
        h = keys.shape[1]
        group = proj.o_proj.weight.shape[1] // d // h
        w_o = proj.o_proj.weight.view(-1, h, group, d)[:, :, 0]  # [hidden, h, d]
        through = torch.einsum("bhnd,ehd->bhne", ctx.values.to(w_o.dtype), w_o).norm(dim=-1)
        w_q = proj.q_proj.weight.view(h, group, d, -1)[:, 0]  # [h, d, hidden]
        return through + 1e-3 * torch.einsum("bhnd,hde->bhne", keys.to(w_q.dtype), w_q).norm(dim=-1)


@pytest.fixture(autouse=True, scope="module")
def registered():
    register(ValuesThroughWo)
    yield
    unregister(ValuesThroughWo.name)


CONFIG = {"budget": 24, "chunk_size": 8}
LAYOUTS = {"slot": {}, "gather": GATHER, "graphs": {"cuda_graphs": True, **EMULATED}}


def run(policy, layout="slot", n=70, new=5, dtype="float32"):
    lm = tiny("random:llama-tiny", 2, dtype)
    return make_engine(lm.model, policy, **CONFIG, **LAYOUTS[layout]).generate(prompt(n, seed=4), max_new_tokens=new)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_step_hands_values_and_projections(layout):
    """The chunk's values are ``v_proj`` of its hidden states (captured by the test at each layer's attention
    input), as the layer's own modules compute them."""
    global HIDDEN
    policy = get_policy(ValuesThroughWo.name)
    with capture_hidden_states(tiny("random:llama-tiny", 2, "float32").model) as HIDDEN:
        got = run(policy, layout)
    HIDDEN = None
    assert got.stats.kept_tokens == 24
    model = tiny("random:llama-tiny", 2, "float32").model
    assert len(policy.seen) > 0
    for ctx, chunk_values, hidden in policy.seen:
        attn = model.model.layers[ctx.layer_idx].self_attn
        assert ctx.projections.o_proj is attn.o_proj and ctx.projections.v_proj is attn.v_proj
        b, t, _ = hidden.shape
        assert t == ctx.n_new and ctx.values.shape[:3] == ctx.positions.shape
        with torch.inference_mode():
            fresh = attn.v_proj(hidden).view(b, t, -1, ctx.projections.head_dim).transpose(1, 2)
        torch.testing.assert_close(chunk_values, fresh, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["gather", "graphs"])
def test_every_layout_keeps_what_the_slot_store_keeps(layout):
    assert_same_run(run(get_policy(ValuesThroughWo.name), layout), run(get_policy(ValuesThroughWo.name)), atol=1e-6)


def test_a_head_shared_pool_hands_them_too():
    """AdaKV wraps it: the values come regrouped per head like the keys; the slot pool equals the gather pool."""
    pool = run(get_policy("ada", inner=ValuesThroughWo()))
    ref = run(get_policy("ada", inner=ValuesThroughWo()), "gather")
    assert_same_run(pool, ref, atol=1e-6)


def test_a_batch_row_keeps_what_it_keeps_alone():
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = make_engine(lm.model, ValuesThroughWo(), **CONFIG)
    ps = [prompt(n, seed=s)[0] for n, s in ((37, 1), (70, 2), (5, 3))]
    for ids, got in zip(ps, eng.generate_batch(ps, max_new_tokens=6)):
        assert_same_run(got, eng.generate(ids.unsqueeze(0), max_new_tokens=6))


def test_shared_steps_record_the_values_it_reads():
    """Through a shared store (its steps replayed from another cell's recording) it keeps what it keeps alone."""
    lm = tiny("random:llama-tiny", 2)
    store = SharedSteps([get_policy("keydiff"), ValuesThroughWo()], max_tokens=32)
    runs = []
    for policy in (get_policy("keydiff"), ValuesThroughWo(), ValuesThroughWo()):
        eng = make_engine(lm.model, policy, **CONFIG)
        with eng.sharing(store):
            runs.append(eng.generate(prompt(70, seed=4), max_new_tokens=5))
    assert store.replayed > 0
    alone = run(ValuesThroughWo())
    for got in runs[1:]:
        assert_same_run(got, alone, atol=0)
        assert got.stats.replayed_steps > 0
