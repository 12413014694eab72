"""Merging (kvpress' MergingPress): a known answer on tiny tensors and the gates; on a tiny model, in one shot the
kept values are an oracle's merge of the full cache's values (written here token by token from the rule), keys
and kept positions are the inner policy's, and only the merged-into values change; chunk by chunk the merges of
every eviction compose (layer 0 replayed from the full cache's tokens), the cache holds N + B at most and the
inner policy's bytes; ragged batches and the graph path give what the plain path gives; a quantized store
quantizes merged values again; refusals are one line."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.merging import Merging, merge_values
from kdeval.evals.task_run.settings import RunSettings
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.quant.store import QuantizedStore
from kdeval.keydiff.policy.interface import Freed, ScoreContext

from ..keydiff.helpers import assert_ragged_batch_matches_alone, kept_positions, make_engine, prompt, tiny
from ..keydiff.oracles import EMULATED
from ..keydiff.test_kv_quant import KIVI, PER_TOKEN, assert_stored_quantized

L, N, B = 60, 20, 12
EPS = 1e-6


def oracle_merge(keys, values, kept, threshold=0.0, fraction=1.0):
    """The rule for one head, one freed token at a time: ``keys [n, d]``, ``values [n, dv]`` (float64), ``kept``:
    the kept indices; the freed ones are the rest, in index order → the new values ``[n, dv]``."""
    freed = [i for i in range(keys.shape[0]) if i not in set(kept)]
    unit = keys / keys.norm(dim=-1, keepdim=True).clamp(min=EPS)
    best = []
    for i in freed:
        sims = [float(unit[i] @ unit[j]) for j in kept]
        j = max(range(len(kept)), key=lambda a: (sims[a], -a))  # the first of equal maxima
        best.append((sims[j], kept[j]))
    ok = [s >= threshold for s, _ in best]
    if fraction < 1.0:
        cut = torch.tensor([s if o else float("-inf") for (s, _), o in zip(best, ok)]).quantile(1 - fraction)
        ok = [o and s >= cut for (s, _), o in zip(best, ok)]
    out = values.clone()
    add = {j: (torch.zeros_like(values[0]), 0.0) for j in kept}
    for i, (s, j), o in zip(freed, best, ok):
        if not o:
            continue
        vi, vj = values[i].norm(), values[j].norm()
        w = max(s, 0.0) * vi / (vi + vj + EPS)
        add[j] = (add[j][0] + w * values[i], add[j][1] + float(w))
    for j, (acc, total) in add.items():
        if total > 0:
            out[j] = (values[j] + acc) / (1 + total)
    return out


def one_head(keys, values, kept, **gates):
    """``merge_values`` on one head ``[n, d]`` with the freed slots the complement of ``kept``."""
    n = keys.shape[0]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    freed = (~mask).nonzero().view(1, 1, -1)
    vals = values.clone().view(1, 1, n, -1)
    ctx = ScoreContext(0, torch.arange(n).view(1, 1, n), n, n)
    merge_values(keys.view(1, 1, n, -1), Freed(vals, freed, mask.view(1, 1, n)), ctx,
                 gates.get("threshold", 0.0), gates.get("fraction", 1.0))
    return vals[0, 0]


def test_known_answer_on_four_tokens():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.0, -1.0]], dtype=torch.float64)
    values = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 4.0], [5.0, 5.0]], dtype=torch.float64)
    got = one_head(keys, values, [0, 1])
    s = 1 / 1.01 ** 0.5  # token 2's cosine to token 0; token 3's best is 0 (cosine 0 with token 0): weight 0
    w = s * 4 / (4 + 2 + EPS)
    assert torch.allclose(got[0], torch.tensor([2.0, 4.0 * w], dtype=torch.float64) / (1 + w), atol=1e-12)
    assert torch.equal(got[1], values[1])  # nothing merged into it
    assert torch.equal(got[2:], values[2:])  # the freed slots are left as they are (the commit drops them)
    assert torch.equal(one_head(keys, values, [0, 1], threshold=0.999), values)  # s = 0.995 < 0.999


@pytest.mark.parametrize("threshold, fraction", [(0.0, 1.0), (0.2, 1.0), (0.0, 0.5), (0.1, 0.75)])
def test_random_heads_match_the_oracle(threshold, fraction):
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        keys = torch.randn(24, 8, generator=g, dtype=torch.float64)
        values = torch.randn(24, 8, generator=g, dtype=torch.float64)
        kept = sorted(torch.randperm(24, generator=g)[:9].tolist())
        want = oracle_merge(keys, values, kept, threshold, fraction)
        got = one_head(keys, values, kept, threshold=threshold, fraction=fraction)
        assert torch.allclose(got, want, atol=1e-12)
    assert not torch.equal(got, values)


def layer_tokens(layer):
    """A slot layer's keys, values and positions ``[1, h, n, ...]`` in position order."""
    keys, positions, _ = layer.view()
    order = positions.argsort(-1)
    values = layer.values[:, :, : keys.shape[2]]
    take = order.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, take), values.gather(2, take), positions.gather(-1, order)


@pytest.mark.parametrize("inner", [{"name": "knorm"}, {"name": "snapkv", "params": {"window": 8}},
                                   {"name": "keydiff"}])
def test_one_shot_is_the_oracle_merge_of_the_full_cache(inner):
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=2)
    full = Engine(lm.model, get_policy("full"), EngineConfig(budget=None, chunk_size=L)).prefill(ids)
    config = EngineConfig(budget=N, chunk_size=L)
    alone = Engine(lm.model, get_policy(inner["name"], **inner.get("params", {})), config).prefill(ids)
    merged = Engine(lm.model, get_policy("merging", inner=inner), config).prefill(ids)
    changed = 0
    for lf, la, lm_ in zip(full.cache.layers, alone.cache.layers, merged.cache.layers):
        fk, fv, _ = layer_tokens(lf)
        ak, av, ap = layer_tokens(la)
        mk, mv, mp = layer_tokens(lm_)
        assert torch.equal(mp, ap) and torch.equal(mk, ak)  # the inner policy's kept set, keys untouched
        for h in range(2):
            kept = ap[0, h].tolist()
            want = oracle_merge(fk[0, h], fv[0, h], kept)[kept]
            assert torch.allclose(mv[0, h], want, atol=1e-12)
            moved = (mv[0, h] != av[0, h]).any(-1)
            assert torch.equal(moved, (want != fv[0, h][kept]).any(-1))  # changed exactly where merged into
            changed += int(moved.sum())
    assert changed > 0


def test_chunked_merges_compose_and_hold_n_plus_b():
    """Layer 0's keys and values depend only on the tokens: its run of chunks is replayed from the full cache's
    layer 0, KNorm's selection (keep the N smallest key norms) then the oracle's merge at every eviction."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=3)
    full = Engine(lm.model, get_policy("full"), EngineConfig(budget=None, chunk_size=L)).prefill(ids)
    fk, fv, _ = layer_tokens(full.cache.layers[0])
    peaks = []
    eng = make_engine(lm.model, get_policy("merging"), on_step=lambda s: peaks.append(s.cache.layers[0].length),
                      budget=N, chunk_size=B)
    state = eng.prefill(ids)
    mk, mv, mp = layer_tokens(state.cache.layers[0])
    for h in range(2):
        held, vals = [], fv[0, h, :0]
        for start in range(0, L, B):
            held = held + list(range(start, min(start + B, L)))
            vals = torch.cat([vals, fv[0, h, start : start + B]])
            if len(held) <= N:
                continue
            keys = fk[0, h, held]
            kept = sorted(keys.norm(dim=-1).argsort()[:N].tolist())
            vals = oracle_merge(keys, vals, kept)[kept]
            held = [held[i] for i in kept]
        assert mp[0, h].tolist() == held
        assert torch.allclose(mv[0, h], vals, atol=1e-12)
        assert torch.equal(mk[0, h], fk[0, h, held])
    assert max(peaks) <= N and state.peak_kv_tokens <= N + B


def test_bytes_are_the_inner_policys():
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(90, seed=4)
    runs = [Engine(lm.model, p, EngineConfig(budget=40, chunk_size=16)).generate(ids, max_new_tokens=4)
            for p in (get_policy("snapkv"), Merging(inner="snapkv"))]
    a, b = (r.stats for r in runs)
    assert (a.peak_kv_bytes, a.kv_cache_bytes, a.peak_kv_tokens, a.kept_tokens) == (
        b.peak_kv_bytes, b.kv_cache_bytes, b.peak_kv_tokens, b.kept_tokens)
    assert b.peak_kv_tokens <= 40 + 16


@pytest.mark.parametrize("params", [{}, {"merge_fraction": 0.5}])
def test_ragged_batch_matches_alone(params):
    assert_ragged_batch_matches_alone(get_policy("merging", **params))


def assert_ragged_values_match_alone(policy):
    """A ragged batch's kept positions, keys and values equal each prompt's run alone (N=24, B=16, float64 tiny)."""
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = Engine(lm.model, policy, EngineConfig(budget=24, chunk_size=16))
    g = torch.Generator().manual_seed(5)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (37, 70, 5)]
    for ids, got in zip(ps, eng.generate_batch(ps, max_new_tokens=3)):
        ref = eng.generate(ids.unsqueeze(0), max_new_tokens=3)
        for la, lb in zip(got.state.cache.layers, ref.state.cache.layers):
            ka, va, pa = layer_tokens(la)
            kb, vb, pb = layer_tokens(lb)
            assert torch.equal(pa, pb) and torch.allclose(va, vb, atol=1e-10) and torch.allclose(ka, kb, atol=1e-10)


@pytest.mark.parametrize("params", [{}, {"merge_fraction": 0.5, "inner": "keydiff"}])
def test_ragged_batch_values_match_alone(params):
    assert_ragged_values_match_alone(get_policy("merging", **params))


def assert_graph_path_equals_eager(policy):
    """The graph path gives the eager path's tokens, kept positions and values (N=40, B=16, float64 tiny)."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(90, seed=6)
    engines = [make_engine(lm.model, policy, budget=40, chunk_size=16, **extra)
               for extra in ({}, {"cuda_graphs": True, **EMULATED})]
    assert [e.plan.use_graphs for e in engines] == [False, True]
    runs = [e.generate(ids, max_new_tokens=4) for e in engines]
    assert runs[0].tokens == runs[1].tokens
    for la, lb in zip(runs[0].state.cache.layers, runs[1].state.cache.layers):
        ka, va, pa = layer_tokens(la)
        kb, vb, pb = layer_tokens(lb)
        assert torch.equal(pa, pb) and torch.allclose(va, vb, atol=1e-10)


def test_graph_path_equals_eager():
    assert_graph_path_equals_eager(get_policy("merging", merge_fraction=0.75))


def assert_runner_holds_the_budget(name, compress):
    """``name`` through the runner on phonebook (N=64, B=32): each row keeps N (and the question under
    ``compress: context``) and decodes its 4 tokens."""
    from kdeval.evals.benchmarks.registry import get_task
    from kdeval.evals.task_run.runner import build_prompts, run_task
    from kdeval.evals.tasks.prompting import PromptBuilder

    lm = tiny("random:llama-tiny")
    task = get_task("phonebook", lengths=[500], num_books=1, questions_per_book=2, max_new_tokens=4)
    _, prompts = build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context))
    rows = run_task(lm, task, RunSettings(policy=name, budget=64, chunk_size=32, compress=compress))
    for row, p in zip(rows, prompts):
        assert row["kept_tokens"] == 64 + (len(p.suffix_ids) if compress == "context" else 0)
        assert row["generated_tokens"] == 4


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_both_protocols_run_through_the_runner_and_hold_the_budget(compress):
    assert_runner_holds_the_budget("merging", compress)


@pytest.mark.parametrize("params, message", [
    ({"similarity_threshold": 1.5}, r"similarity_threshold: must be in \[0, 1\], got 1.5"),
    ({"merge_fraction": 0}, r"merge_fraction: must be in \(0, 1\], got 0"),
    ({"merge_fraction": "1"}, "merge_fraction: expected a number, got '1'"),
    ({"inner": "ada"}, r"inner: policy 'ada' shares a layer's slots among its KV heads \(a head pool does not "
                       r"merge\) \(policies it can wrap: .*\)"),
    ({"inner": "merging"}, r"inner: policy 'merging' already merges \(policies it can wrap: .*\)"),
    ({"inner": "full"}, r"inner: policy 'full' does not score tokens \(policies it can wrap: .*\)"),
    ({"inner": "knrom"}, r"inner: unknown policy 'knrom' \(did you mean .*knorm.*"),
])
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Merging(**params)


@pytest.mark.parametrize("quant", [dict(KIVI, bits=2, group_size=8), PER_TOKEN])  # groups of 8 > 4 levels
def test_a_quantized_store_quantizes_the_merged_values_again(quant, monkeypatch):
    """Under kv_quant the values merged into tokens already stored quantized are put back on their grid: the grid
    check fails when that step is skipped."""
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = make_engine(lm.model, get_policy("merging", inner="keydiff"), budget=32, chunk_size=16, kv_quant=quant)
    res = eng.generate(prompt(80, seed=8), max_new_tokens=2)
    assert res.stats.peak_kv_tokens <= 32 + 16
    assert_stored_quantized(res, quant)
    monkeypatch.setattr(QuantizedStore, "requantize_values", lambda *args: None)
    with pytest.raises(AssertionError):
        assert_stored_quantized(eng.generate(prompt(80, seed=8), max_new_tokens=2), quant)


def test_kept_positions_are_the_inner_policys_in_layer_zero_chunk_by_chunk():
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(90, seed=7)
    a, b = (kept_positions(Engine(lm.model, get_policy(p, **kw), EngineConfig(budget=40, chunk_size=16))
                           .prefill(ids))[0] for p, kw in (("knorm", {}), ("merging", {"inner": "knorm"})))
    assert torch.equal(a, b)
