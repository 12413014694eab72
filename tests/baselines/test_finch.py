"""Finch: in one shot its kept set is kvpress' rule computed here from the model's full attention matrices; the
normalization changes the kept set; re-rotation holds the kept keys at contiguous RoPE positions; chunked, a
ragged batch keeps what each request keeps alone and the cache holds N; bad parameters are refused with one line."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.finch import Finch
from kdeval.evals.task_run.settings import RunSettings
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model

from ..keydiff.helpers import assert_ragged_batch_matches_alone, kept_positions, prompt
from .test_policy_rules import eager_attentions
from .test_sink_rerotate import at_positions, layer0_keys

L, W, N = 64, 8, 24


def finch_reference(attn: torch.Tensor, normalize: bool) -> list[set[int]]:
    """kvpress' FinchPress from one layer's eager attention ``[1, hq, L, L]`` (2 KV heads): the last ``W`` rows over
    the context columns, row ``i`` times ``L - W + i`` when normalized, averaged over rows and the group; the top
    ``N - W`` context tokens plus the window, per KV head."""
    rows = attn[0, :, -W:, : L - W]  # [hq, W, L - W]
    if normalize:
        rows = rows * torch.arange(L - W, L, dtype=rows.dtype).view(1, -1, 1)
    scores = rows.mean(1).view(2, -1, L - W).mean(1)
    window = set(range(L - W, L))
    return [set(scores[h].topk(N - W).indices.tolist()) | window for h in range(2)]


def one_shot(**params):
    lm = load_model("random:llama-tiny", overrides={"num_key_value_heads": 2})
    ids = prompt(L, seed=4)
    state = Engine(lm.model, get_policy("finch", window=W, **params), EngineConfig(budget=N, chunk_size=L)).prefill(ids)
    return lm, ids, state


@pytest.mark.parametrize("normalize", [True, False])
def test_one_shot_keeps_kvpress_rule_from_the_full_attention(normalize):
    _, ids, state = one_shot(normalize=normalize)
    for li, attn in enumerate(eager_attentions(ids)):
        expect = finch_reference(attn.double(), normalize)
        got = kept_positions(state)[li][0]
        assert [set(got[h].tolist()) for h in range(2)] == expect


def test_normalization_changes_what_is_kept():
    with_norm = kept_positions(one_shot(normalize=True)[2])
    without = kept_positions(one_shot(normalize=False)[2])
    assert any(not torch.equal(a, b) for a, b in zip(with_norm, without))


@torch.inference_mode()
def test_kept_keys_are_rerotated_to_contiguous_positions():
    lm, ids, state = one_shot()
    keys, positions, _ = state.cache.layers[0].view()
    order = positions[0].argsort(-1)
    pre = layer0_keys(lm.model, ids)
    for h in range(2):
        held = positions[0, h].gather(-1, order[h])
        want = at_positions(lm.model, pre[:, h:h + 1, held], torch.arange(N))[0, 0]
        got = keys[0, h][order[h]]
        assert torch.allclose(got, want, atol=1e-4)
        assert not torch.allclose(got, at_positions(lm.model, pre[:, h:h + 1, held], held)[0, 0], atol=1e-3)


@torch.inference_mode()
def test_without_rerotate_the_kept_keys_stay_at_their_positions():
    lm, ids, state = one_shot(rerotate=False)
    keys, positions, _ = state.cache.layers[0].view()
    pre = layer0_keys(lm.model, ids)
    for h in range(2):
        held = positions[0, h]
        want = at_positions(lm.model, pre[:, h:h + 1, held], held)[0, 0]
        assert torch.allclose(keys[0, h], want, atol=1e-4)


def test_ragged_batch_matches_alone():
    assert_ragged_batch_matches_alone(get_policy("finch", window=8))


def test_chunked_holds_the_bound_and_the_window():
    lm = load_model("random:llama-tiny", overrides={"num_key_value_heads": 2})
    eng = Engine(lm.model, get_policy("finch", window=W), EngineConfig(budget=N, chunk_size=10))
    state = eng.prefill(prompt(L, seed=5))
    for layer in kept_positions(state):
        assert layer.shape[-1] == N
        assert set(range(L - W, L)) <= set(layer[0, 0].tolist())


@pytest.mark.parametrize("params, message", [
    ({"window": 0}, "window: must be an integer > 0, got 0"),
    ({"window": "8"}, "window: must be an integer > 0, got '8'"),
    ({"normalize": 1}, "normalize: expected true or false, got 1"),
])
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Finch(**params)


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_both_protocols_run_through_the_runner_and_hold_the_budget(compress):
    """Query-aware the window ends the question; query-agnostic it ends the context and the question is fed
    after the eviction, on top of N (at RoPE positions from N on, the kept keys re-rotated)."""
    from kdeval.evals.benchmarks.registry import get_task
    from kdeval.evals.task_run.runner import build_prompts, run_task
    from kdeval.evals.tasks.prompting import PromptBuilder

    lm = load_model("random:llama-tiny")
    task = get_task("phonebook", lengths=[500], num_books=1, questions_per_book=2, max_new_tokens=4)
    _, prompts = build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context))
    rows = run_task(lm, task, RunSettings(policy="finch", budget=64, chunk_size=32, compress=compress))
    for row, p in zip(rows, prompts):
        assert row["kept_tokens"] == 64 + (len(p.suffix_ids) if compress == "context" else 0)
        assert row["generated_tokens"] == 4
