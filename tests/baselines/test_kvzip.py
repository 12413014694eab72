"""KVzip: its scores are the max attention of the repeat prompt's queries, computed here from one plain forward of
the prompt followed by each repeat piece; the kept set is their top N; the repeat's KV never enters the cache;
chunked, each chunk is reconstructed once; the extra tokens are counted in rows; a batch equals each request alone;
both protocols; what cannot run is refused with one line."""
import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kdeval.baselines import describe, get_policy
from kdeval.baselines.kvzip import UNSCORED, KVzip
from kdeval.evals.task_run.settings import RunSettings
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model
from kdeval.keydiff.attention.repeat_prompt import FIRST, LATER, RepeatPrompt

from ..keydiff.helpers import kept_positions, make_engine, prompt
from ..keydiff.oracles import EMULATED, GATHER

L, HEAD, SINKS, PIECE = 60, 6, 4, 25
#: a repeat prompt of hand-made ids: a 6-token chat head, the two instructions and a suffix
RP = RepeatPrompt(head=tuple(range(200, 200 + HEAD)), first=(1, 2, 3), later=(4, 5), suffix=(6, 7))
RECORD = "kdeval_test_record"
_seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _record(module, query, key, value, attention_mask, **kwargs):
    _seen[module.layer_idx] = (query, key)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(RECORD, _record)
AttentionMaskInterface.register(RECORD, sdpa_mask)


def tiny64():
    return load_model("random:llama-tiny", dtype="float64")


def ids_with_head(seed=4) -> torch.Tensor:
    ids = prompt(L, seed=seed)
    ids[0, :HEAD] = torch.tensor(RP.head)
    return ids


def queries_and_keys(model, ids: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's rotated queries ``[1, hq, T, d]`` and keys ``[1, hk, T, d]`` of one plain forward of ``ids``."""
    before = model.config._attn_implementation
    model.config._attn_implementation = RECORD
    try:
        _seen.clear()
        with torch.no_grad():
            model(ids)
        return dict(_seen)
    finally:
        model.config._attn_implementation = before


def piece_rule(model, ids: torch.Tensor, rep: torch.Tensor, a: int, e: int) -> dict[int, torch.Tensor]:
    """kvpress' KVzip rule written out for one piece: ``rep`` fed after the ``n`` tokens ``ids``; a repeat query's
    softmax over the sinks (positions < min(4, a)), the piece ``[a, e)`` and the repeat's tokens up to itself; per
    layer the max over the KV head's query heads and the repeat's queries, ``[hk, e - a]``."""
    n, r = ids.shape[1], rep.shape[1]
    out = {}
    for i, (q, k) in queries_and_keys(model, torch.cat([ids, rep], dim=1)).items():
        hq, hk, d = q.shape[1], k.shape[1], q.shape[-1]
        best = torch.zeros(hk, e - a, dtype=torch.float64)
        for h in range(hk):
            for g in range(h * (hq // hk), (h + 1) * (hq // hk)):
                for row in range(r):
                    cols = list(range(min(SINKS, a))) + list(range(a, e)) + list(range(n, n + row + 1))
                    p = (q[0, g, n + row] @ k[0, h, cols].T / d ** 0.5).softmax(-1)
                    best[h] = torch.maximum(best[h], p[min(SINKS, a) : min(SINKS, a) + e - a])
        out[i] = best
    return out


def reference_scores(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer ``[hk, L]``, one shot: pieces [6, 31), [31, 56), [56, 60), the first after ``first``, the later
    ones after ``later`` and the 8 tokens before them, then the suffix; each fed after the whole prompt; the chat
    head scores 0."""
    out: list[torch.Tensor] = []
    for a in range(HEAD, L, PIECE):
        e = min(a + PIECE, L)
        lead = list(RP.first) if a == HEAD else list(RP.later) + ids[0, a - 8 : a].tolist()
        rep = torch.tensor([lead + list(RP.suffix) + ids[0, a:e].tolist()])
        for i, s in piece_rule(model, ids, rep, a, e).items():
            if len(out) <= i:
                out.append(torch.zeros(s.shape[0], L, dtype=torch.float64))
            out[i][:, a:e] = s
    return out


def held_scores(state) -> list[torch.Tensor]:
    """Per layer, the kept tokens' scores ``[hk, L]`` by position (a test with no eviction)."""
    out = []
    for layer in state.cache.layers:
        _, positions, st = layer.view()
        out.append(torch.zeros(positions.shape[1], L, dtype=torch.float64).scatter(
            1, positions[0], st["kvzip"][0].double()))
    return out


@pytest.fixture(scope="module")
def one_shot():
    lm = tiny64()
    ids = ids_with_head()
    policy = KVzip(repeat_chunk=PIECE)
    full = Engine(lm.model, policy, EngineConfig(budget=L, chunk_size=L), repeat_prompt=RP).prefill(ids)
    return lm, ids, full, reference_scores(lm.model, ids)


def test_scores_are_the_max_attention_of_the_repeat(one_shot):
    _, _, full, ref = one_shot
    for li, (got, want) in enumerate(zip(held_scores(full), ref)):
        assert torch.allclose(got, want, rtol=2e-7, atol=0), li  # the per-token state is float32
        assert (got[:, SINKS:HEAD] == 0).all()  # the chat head is not reconstructed
        assert (got[:, HEAD:] > 0).all()
    assert full.extra_forward_tokens == 3 + 2 + (L - HEAD) + 2 * (2 + 8 + 2)


@pytest.mark.parametrize("n", [12, 30])
def test_the_kept_set_is_the_top_n_of_the_scores_and_the_repeat_kv_is_gone(one_shot, n):
    lm, ids, _, ref = one_shot
    state = Engine(lm.model, KVzip(repeat_chunk=PIECE), EngineConfig(budget=n, chunk_size=L),
                   repeat_prompt=RP).prefill(ids)
    with torch.no_grad():
        plain = lm.model(ids, use_cache=True).past_key_values
    assert state.seen == L and state.peak_kv_tokens == L
    for li, (layer, scores) in enumerate(zip(state.cache.layers, ref)):
        keys, positions, _ = layer.view()
        assert keys.shape[2] == n and int(positions.max()) < L  # the repeat's tokens (positions >= L) are not held
        for h in range(scores.shape[0]):
            s = scores[h].clone()
            s[:SINKS] = float("inf")
            assert set(positions[0, h].tolist()) == set(s.topk(n).indices.tolist()), (li, h)
            order = positions[0, h]
            assert torch.equal(keys[0, h], plain.layers[li].keys[0, h, order])  # the prompt's own keys


def test_chunked_reconstructs_each_chunk_once_over_the_held_cache():
    """B = 20, N = 24: every chunk's tokens are scored by its own repeat (later chunks: ``later`` and the 8 tokens
    before); the first chunk's scores, taken before any eviction, are the one-shot rule's over that chunk."""
    lm = tiny64()
    ids = ids_with_head()
    seen = []
    eng = Engine(lm.model, KVzip(), EngineConfig(budget=24, chunk_size=20), repeat_prompt=RP,
                 on_step=lambda s: seen.append([layer.view()[2]["kvzip"].clone() for layer in s.cache.layers]))
    state = eng.prefill(ids)
    assert state.extra_forward_tokens == (3 + 2 + 14) + 2 * (2 + 8 + 2 + 20)
    assert state.peak_kv_tokens == 24 + 20 and [layer.length for layer in state.cache.layers] == [24] * 3
    rep = torch.tensor([list(RP.first) + list(RP.suffix) + ids[0, HEAD:20].tolist()])
    for li, want in piece_rule(lm.model, ids[:, :20], rep, HEAD, 20).items():  # chunk 1, before any eviction
        assert torch.allclose(seen[0][li][0, :, HEAD:20].double(), want, rtol=2e-7, atol=0)
    # chunk 2 was reconstructed over the 24 tokens chunk 1 left... and the 20 of chunk 2: its scores came from a
    # forward over those, so they differ from the one-shot rule's (which saw every token)
    assert all(st.shape[-1] == 24 for st in seen[-1])


def test_decoded_and_protected_tokens_are_unscored_and_the_budget_holds():
    """kvpress' protocol: the question is held on top of N; decoding evicts the lowest-scored context token first."""
    lm = load_model("random:llama-tiny")
    ids = prompt(90, seed=2)
    eng = Engine(lm.model, KVzip(), EngineConfig(budget=40, chunk_size=70))
    res = eng.generate(ids, max_new_tokens=5, protect_last=20)
    assert res.stats.extra_forward_tokens == len(RepeatPrompt().first) + 70  # the bare prompt: the context again
    for layer in res.state.cache.layers:
        _, positions, st = layer.view()
        assert positions.shape[-1] == 40 + 20
        assert set(range(70, 90)) <= set(positions[0, 0].tolist())  # the question is kept
        decoded = positions >= 90
        assert decoded.sum(-1).tolist() == [[4, 4]]  # the decoded tokens fed so far are kept, scored UNSCORED
        assert (st["kvzip"][decoded] == UNSCORED).all() and (st["kvzip"][positions < 70] < 1).all()


def test_a_batch_equals_each_request_alone():
    lm = load_model("random:llama-tiny")
    eng = Engine(lm.model, KVzip(repeat_chunk=16), EngineConfig(budget=24, chunk_size=32), repeat_prompt=RP)
    prompts = [prompt(n, seed=n)[0] for n in (40, 70, 33, 90)]
    both = eng.generate_batch(prompts, max_new_tokens=4)
    for p, got in zip(prompts, both):
        alone = eng.generate(p.unsqueeze(0), max_new_tokens=4)
        assert got.tokens == alone.tokens and got.stats.extra_forward_tokens == alone.stats.extra_forward_tokens
        for a, b in zip(kept_positions(got.state), kept_positions(alone.state)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_rows_count_the_extra_forward_tokens_under_both_protocols(compress):
    from kdeval.evals.benchmarks.registry import get_task
    from kdeval.evals.task_run.runner import build_prompts, run_task
    from kdeval.evals.tasks.prompting import PromptBuilder

    lm = load_model("random:llama-tiny")
    task = get_task("phonebook", lengths=[300], num_books=1, questions_per_book=2, max_new_tokens=3)
    _, prompts = build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context))
    rp = RepeatPrompt.from_tokenizer(lm.tokenizer)
    rows = run_task(lm, task, RunSettings(policy="kvzip", budget=64, chunk_size="whole", compress=compress))
    for row, p in zip(rows, prompts):
        compressed = len(p.prefix_ids) if compress == "context" else p.n_tokens
        assert row["extra_forward_tokens"] == len(rp.first) + len(rp.suffix) + compressed
        assert row["kept_tokens"] == 64 + (len(p.suffix_ids) if compress == "context" else 0)
    assert all(r["extra_forward_tokens"] == 0 for r in run_task(lm, task, RunSettings(policy="keydiff", budget=64,
                                                                                      chunk_size=32)))


def test_the_repeat_prompt_follows_the_chat_template():
    class Tok:
        chat_template = "yes"

        def apply_chat_template(self, messages, **kwargs):
            assert kwargs == {"add_generation_prompt": True, "tokenize": False, "enable_thinking": False}
            return f"<s>[sys]<user>{messages[0]['content']}</user><bot>"

        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    rp = RepeatPrompt.from_tokenizer(Tok())
    assert "".join(map(chr, rp.head)) == "<s>[sys]<user>" and "".join(map(chr, rp.suffix)) == "</user><bot>"
    assert "".join(map(chr, rp.first)) == FIRST and "".join(map(chr, rp.later)) == LATER


def test_described_and_refused_with_one_line():
    info = describe("kvzip")
    assert "one extra forward over the repeat prompt and the context" in info.cost
    assert "no CUDA graphs (a repeat pass after each evicting prompt step)" in info.cost
    with pytest.raises(ValueError, match=r"^repeat_chunk: must be an integer >= 1, got 0$"):
        KVzip(repeat_chunk=0)
    with pytest.raises(ValueError, match=r"^n_sink_tokens: must be an integer >= 0, got -1$"):
        get_policy("kvzip", n_sink_tokens="-1")
    with pytest.raises(ValueError, match=r"^inner: policy 'kvzip' needs per-token state"):
        get_policy("ada", inner="kvzip")
    eager = load_model("random:llama-tiny", attn_implementation="eager")
    with pytest.raises(ValueError, match=r"^attn_implementation: policy 'kvzip' scores a repeat pass"):
        Engine(eager.model, KVzip(), EngineConfig(budget=8, chunk_size=8))


def test_asked_for_graphs_it_runs_eagerly_and_keeps_what_the_gather_store_keeps():
    lm = load_model("random:llama-tiny", dtype="float64")
    ids = prompt(70, seed=5)
    graphs = make_engine(lm.model, KVzip(), budget=24, chunk_size=16, cuda_graphs=True, **EMULATED)
    gather = make_engine(lm.model, KVzip(), budget=24, chunk_size=16, **GATHER)
    assert not graphs.plan.use_graphs and "a repeat pass after each evicting prompt step" in graphs.plan.graphs_off
    got, ref = graphs.generate(ids, max_new_tokens=4), gather.generate(ids, max_new_tokens=4)
    assert got.tokens == ref.tokens and got.stats.extra_forward_tokens == ref.stats.extra_forward_tokens
    for a, b in zip(kept_positions(got.state), kept_positions(ref.state)):
        assert torch.equal(a, b)


def test_a_group_of_cells_gives_each_cell_its_alone_rows():
    """run_group: kvzip cells replay the prompt forward other cells recorded, run their own repeat pass, and decode
    (``decode: keep``) in batches with other cells; their rows are their alone rows, extra tokens included."""
    from kdeval.evals.benchmarks.registry import get_task
    from kdeval.evals.task_run.group_run import run_group
    from kdeval.evals.task_run.runner import model_prompts, run_task

    lm = load_model("random:llama-tiny")
    task = get_task("needle", lengths=[600], depths=[20, 60, 80], haystack="noise")
    prompts = model_prompts(lm, task, max_new_tokens=4)
    cells = [RunSettings(policy=p, budget=b, chunk_size=c, compress="context", decode=d, max_new_tokens=4)
             for p, b, c, d in (("keydiff", 64, "whole", "keep"), ("kvzip", 64, "whole", "keep"),
                                ("kvzip", 96, "whole", "evict"), ("kvzip", 64, 32, "keep"))]
    grouped = run_group(lm, task, cells, prompts)
    how = {"ttft_s", "decode_s", "peak_memory_bytes", "timing_batch", "shared_prefill_s", "kv_buffer_bytes", "execution",
           "replayed_steps"}
    for cell, got in zip(cells, grouped):
        alone = run_task(lm, task, cell, prompts=prompts)
        assert [{k: v for k, v in r.items() if k not in how} for r in got.rows] == \
               [{k: v for k, v in r.items() if k not in how} for r in alone], cell
        if cell.policy == "kvzip":
            assert all(r["extra_forward_tokens"] > 0 for r in got.rows)
    assert any(r["replayed_steps"] > 0 for r in grouped[1].rows + grouped[2].rows)
