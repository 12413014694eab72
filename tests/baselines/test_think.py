"""ThinK: the channel scores on a tiny tensor; in one shot the kept set is the inner policy's and the zeroed channels
are kvpress' rule computed here from a plain forward; chunked, the cache holds N + B, a zeroed channel stays zero
and every head zeroes at least its share; KV bytes are the inner policy's (full width); a ragged batch edits each
row as alone; both protocols run; bad parameters and inner policies are refused with one line."""
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kdeval.baselines import describe, get_policy
from kdeval.baselines.think import ThinK, channel_scores, lowest_channels
from kdeval.evals.task_run.settings import RunSettings
from kdeval.keydiff import Engine, EngineConfig

from ..keydiff.helpers import kept_positions, make_engine, prompt, tiny

L, W, N = 64, 8, 24
SNAPKV = {"name": "snapkv", "params": {"window": W}}


def test_channel_scores_known_answer():
    """q^2 averaged over the valid window entries and the group, times k^2 averaged over the real keys."""
    q = torch.tensor([[[[1., 2.], [3., 0.], [99., 99.]],   # query head 0 (the third entry holds no query)
                       [[0., 2.], [1., 0.], [99., 99.]]]])  # query head 1: both of the KV head's group
    valid = torch.tensor([[True, True, False]])
    keys = torch.tensor([[[[1., 1.], [2., 0.], [9., 9.]]]])  # one KV head, the third slot empty
    real = torch.tensor([[[True, True, False]]])
    # q^2: head 0 [5, 2], head 1 [0.5, 2] -> [2.75, 2]; k^2: [2.5, 0.5]
    assert torch.equal(channel_scores(q, valid, keys, real), torch.tensor([[[6.875, 1.0]]]))


def test_lowest_channels_ties_go_to_the_lower_channel():
    got = lowest_channels(torch.tensor([[[1., 0., 1., 0.], [3., 2., 1., 0.]]]), 3)
    assert got.tolist() == [[[True, True, False, True], [False, True, True, True]]]


def one_shot(policy, ids, lm):
    return Engine(lm.model, policy, EngineConfig(budget=N, chunk_size=L)).prefill(ids)


def reference_zeroed(lm, ids, inner_state, ratio) -> list[torch.Tensor]:
    """kvpress' ThinKPress after the inner press, from a plain forward: per layer ``[kv_heads, d]`` bool, the
    channels of lowest mean q^2 (the last ``W`` queries, RoPE at their positions, the group averaged) x mean k^2
    (the keys the inner policy kept)."""
    model = lm.model
    queries = {}
    hooks = [layer.self_attn.q_proj.register_forward_hook(
        lambda m, a, out, i=i: queries.__setitem__(i, out)) for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    for h in hooks:
        h.remove()
    out = []
    for i, layer in enumerate(cache.layers):
        keys = layer.keys[0]  # [kv_heads, L, d], rotated
        hk, _, d = keys.shape
        q = queries[i][:, -W:].view(1, W, -1, d).transpose(1, 2)  # [1, hq, W, d] before RoPE
        cos, sin = model.model.rotary_emb(q, torch.arange(L - W, L).view(1, -1))
        q = apply_rotary_pos_emb(q, q, cos, sin)[0][0]  # [hq, W, d]
        q2 = q.pow(2).mean(1).view(hk, -1, d).mean(1)
        kept = inner_state.cache.layers[i].view()[1][0]  # [kv_heads, N] positions
        k2 = torch.stack([keys[h, kept[h]].pow(2).mean(0) for h in range(hk)])
        low = (q2 * k2).topk(int(d * ratio), dim=-1, largest=False).indices
        out.append(torch.zeros(hk, d, dtype=torch.bool).scatter_(-1, low, True))
    return out


@pytest.mark.parametrize("inner", [SNAPKV, "keydiff"])
@pytest.mark.parametrize("ratio", [0.5, 0.25])
def test_one_shot_keeps_the_inner_set_and_zeroes_kvpress_channels(inner, ratio):
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(L, seed=4)
    state = one_shot(get_policy("think", inner=inner, key_channel_ratio=ratio, window=W), ids, lm)
    inner_policy = get_policy(inner["name"], **inner["params"]) if isinstance(inner, dict) else get_policy(inner)
    alone = one_shot(inner_policy, ids, lm)
    expect = reference_zeroed(lm, ids, alone, ratio)
    for layer, ref_layer, zeroed in zip(state.cache.layers, alone.cache.layers, expect):
        (k, p, _), (kr, pr, _) = layer.view(), ref_layer.view()
        assert torch.equal(p, pr)  # the inner policy's kept set, in the same slots
        got = (k[0] == 0).all(1)  # [kv_heads, d]: channels zero in every kept key
        assert torch.equal(got, zeroed) and int(got[0].sum()) == int(k.shape[-1] * ratio)
        assert torch.equal(k, kr.masked_fill(zeroed.view(1, 2, 1, -1), 0))  # the rest untouched


def test_chunked_holds_n_plus_b_and_a_zeroed_channel_stays_zero():
    """Every step (chunks of 10, then decode steps that evict): at most N + B tokens during the step and N after it;
    each head zeroes at least its share in all its kept keys, and a channel zeroed in a kept token stays zero."""
    lm = tiny("random:llama-tiny", 2)
    zeros: list[dict] = []  # per step, per layer: {(head, position): zeroed channels}
    evicting = []

    def check(state):
        step = {}
        for li, layer in enumerate(state.cache.layers):
            keys, positions, _ = layer.view()
            assert keys.shape[2] == min(N, state.seen)
            if state.seen > N:
                assert bool(((keys[0] == 0).all(1).sum(-1) >= keys.shape[-1] // 2).all())
            for h in range(2):
                for j, pos in enumerate(positions[0, h].tolist()):
                    step[li, h, pos] = keys[0, h, j] == 0
        if zeros and evicting[-1]:
            for key, was in zeros[-1].items():
                if key in step:
                    assert bool((step[key] | ~was).all()), key
        zeros.append(step)
        evicting.append(state.seen > N)

    eng = make_engine(lm.model, get_policy("think", inner=SNAPKV, window=W), check, budget=N, chunk_size=10)
    res = eng.generate(prompt(L, seed=5), max_new_tokens=5)
    assert res.stats.peak_kv_tokens <= N + 10 and len(zeros) == 7 + 4
    grew = any(int((v & ~zeros[i - 1].get(k, v)).sum()) for i in range(1, len(zeros)) for k, v in zeros[i].items()
               if k in zeros[i - 1])
    assert grew  # some kept key lost another channel when the choice moved (chunked, not one shot)


def test_kv_bytes_are_the_inner_policys_and_ratio_zero_is_the_inner_policy():
    """Zeroed channels are stored at full width: the same KV figures as the inner policy alone; with no channel
    pruned, exactly the inner policy's run (tokens, kept sets, keys)."""
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(70, seed=6)
    runs = {name: make_engine(lm.model, policy, budget=N, chunk_size=16).generate(ids, max_new_tokens=4)
            for name, policy in (("think", get_policy("think", inner=SNAPKV, window=W)),
                                 ("zero", get_policy("think", inner=SNAPKV, window=W, key_channel_ratio=0.0)),
                                 ("snapkv", get_policy("snapkv", window=W)))}
    for name in ("think", "zero"):
        for figure in ("peak_kv_bytes", "kv_cache_bytes", "peak_kv_tokens", "kept_tokens"):
            assert getattr(runs[name].stats, figure) == getattr(runs["snapkv"].stats, figure), (name, figure)
    assert runs["zero"].tokens == runs["snapkv"].tokens
    for a, b in zip(runs["zero"].state.cache.layers, runs["snapkv"].state.cache.layers):
        assert torch.equal(a.view()[0], b.view()[0]) and torch.equal(a.view()[1], b.view()[1])
    assert any(not torch.equal(a.view()[0], b.view()[0])
               for a, b in zip(runs["think"].state.cache.layers, runs["snapkv"].state.cache.layers))


def test_nothing_is_edited_before_the_first_eviction():
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(N, seed=7)  # fits in the budget
    state = one_shot(get_policy("think", inner=SNAPKV, window=W), ids, lm)
    full = Engine(lm.model, get_policy("full"), EngineConfig(budget=None, chunk_size=L)).prefill(ids)
    for a, b in zip(state.cache.layers, full.cache.layers):
        assert torch.equal(a.view()[0], b.view()[0])


def test_a_ragged_batch_edits_each_row_as_alone():
    """Rows of other lengths evict at other steps: each row's kept keys (zeroed channels included) are its own."""
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = Engine(lm.model, get_policy("think", inner=SNAPKV, window=W), EngineConfig(budget=N, chunk_size=16))
    ps = [prompt(n, seed=s)[0] for n, s in ((37, 1), (70, 2), (5, 3))]
    for ids, got in zip(ps, eng.generate_batch(ps, max_new_tokens=4)):
        ref = eng.generate(ids.unsqueeze(0), max_new_tokens=4)
        assert got.tokens == ref.tokens
        for a, b, pa, pb in zip(got.state.cache.layers, ref.state.cache.layers, kept_positions(got.state),
                                kept_positions(ref.state)):
            assert torch.equal(pa, pb)
            (ka, qa, _), (kb, qb, _) = a.view(), b.view()
            oa, ob = qa.argsort(-1).unsqueeze(-1), qb.argsort(-1).unsqueeze(-1)
            torch.testing.assert_close(ka.gather(2, oa.expand_as(ka)), kb.gather(2, ob.expand_as(kb)),
                                       rtol=0, atol=1e-10)


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_both_protocols_run_through_the_runner_and_hold_the_budget(compress):
    from kdeval.evals.benchmarks.registry import get_task
    from kdeval.evals.task_run.runner import build_prompts, run_task
    from kdeval.evals.tasks.prompting import PromptBuilder

    lm = tiny("random:llama-tiny")
    task = get_task("phonebook", lengths=[300], num_books=1, questions_per_book=1, max_new_tokens=3)
    _, prompts = build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context))
    rows = run_task(lm, task, RunSettings(policy="think", budget=64, chunk_size=32, compress=compress))
    for row, p in zip(rows, prompts):
        assert row["kept_tokens"] == 64 + (len(p.suffix_ids) if compress == "context" else 0)
        assert row["generated_tokens"] == 3


def test_described_with_its_cost_and_bytes():
    info = describe("think")
    assert "stored at full width" in info.rule and "kept keys edited after every eviction" in info.cost
    assert "no CUDA graphs" in info.cost and info.needs.edits_kept_keys


@pytest.mark.parametrize("params, message", [
    ({"key_channel_ratio": 1.0}, r"key_channel_ratio: must be a number in \[0, 1\), got 1.0"),
    ({"key_channel_ratio": "0.5"}, r"key_channel_ratio: must be a number in \[0, 1\), got '0.5'"),
    ({"window": 0}, "window: must be an integer > 0, got 0"),
    ({"inner": "full"}, "inner: does not evict, so ThinK would never act .*"),
    ({"inner": "ada"}, "inner: shares a layer's slots among its KV heads .*"),
    ({"inner": "sink-rerotate"}, "inner: re-rotates its kept keys, .*"),
    ({"inner": "think"}, "inner: already edits its kept keys .*"),
    ({"inner": "snapvk"}, "inner: unknown policy 'snapvk' \\(did you mean .*snapkv.*"),
    ({"inner": "expected-attention", "window": 600},
     "window: must be at most the 512 queries policy 'expected-attention' keeps, .* got 600"),
])
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ThinK(**params)
