"""The one slot buffer type every cache layout is built from (kdeval/keydiff/cache/slot_buffers.py): allocation, growth,
compaction, row selection, reset and the one byte count, and the engine's KV byte figures on a model whose
values are narrower than its keys."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION, SlotBuffers, state_buffers

from .helpers import prompt


def filled(capacity: int = 4, rows: int = 2, heads: int = 3) -> SlotBuffers:
    """Buffers whose every slot holds its own number: keys/values ``slot + 1``, positions ``slot``, tags ``head``,
    state ``slot / 10``."""
    buf = SlotBuffers(capacity, EMPTY_POSITION, {"tags": (torch.long, -1), **state_buffers(("votes",))})
    buf.allocate(rows, heads, 5, 2, torch.float32, torch.device("cpu"))
    slot = torch.arange(capacity)
    buf.write(0, (slot + 1.0).view(1, 1, -1, 1).expand(rows, heads, -1, 5),
              (slot + 1.0).view(1, 1, -1, 1).expand(rows, heads, -1, 2), slot.view(1, 1, -1),
              tags=torch.arange(heads).view(1, -1, 1), votes=slot.view(1, 1, -1) / 10)
    return buf


def test_allocate_fills_every_buffer_with_its_empty_value():
    buf = SlotBuffers(6, EMPTY_POSITION, {"tags": (torch.long, -1), **state_buffers(("votes",))})
    assert not buf.allocated and buf.nbytes() == 0
    buf.allocate(2, 3, 5, 2, torch.float16, torch.device("cpu"))
    t = buf.tensors
    assert list(t) == ["keys", "values", "positions", "tags", "votes"]
    assert t["keys"].shape == (2, 3, 6, 5) and t["values"].shape == (2, 3, 6, 2) and t["keys"].dtype == torch.float16
    assert bool((t["positions"] == EMPTY_POSITION).all()) and bool((t["tags"] == -1).all())
    assert t["votes"].dtype == torch.float32 and not t["votes"].any() and not t["keys"].any()
    assert buf.nbytes() == 2 * 3 * 6 * (5 + 2) * 2  # keys and values each at their own width


@pytest.mark.parametrize("need, exact, capacity", [(3, False, 4), (5, False, 8), (9, False, 9), (5, True, 5)])
def test_grow_keeps_the_first_slots_and_empties_the_rest(need, exact, capacity):
    buf = filled()
    before = {name: b.clone() for name, b in buf.tensors.items()}
    buf.grow(need, keep=3, exact=exact)
    assert buf.capacity == capacity
    if capacity == 4:  # room already: untouched, same tensors
        assert all(torch.equal(buf.tensors[n], before[n]) for n in before)
        return
    for name, b in buf.tensors.items():
        assert b.shape[2] == capacity
        assert torch.equal(b[:, :, :3], before[name][:, :, :3]), name
        assert bool((b[:, :, 3:] == buf.fills[name]).all()), name


def test_grow_before_allocation_keeps_only_the_number():
    buf = SlotBuffers(4, 0)
    buf.grow(5, keep=0)
    assert buf.capacity == 8 and not buf.allocated
    buf.grow(9, keep=0, exact=True)
    assert buf.capacity == 9


def test_compact_moves_the_surviving_tail_into_the_holes():
    buf = filled(capacity=6, rows=1, heads=1)
    kept = torch.tensor([[[True, False, True, True, False, True]]])
    buf.compact(kept, 4, width=2)  # slot 1 is a hole, slot 4 is dropped: slot 5 moves to 1
    assert buf.tensors["positions"][0, 0, :4].tolist() == [0, 5, 2, 3]
    assert buf.tensors["keys"][0, 0, :4, 0].tolist() == [1.0, 6.0, 3.0, 4.0]
    assert buf.tensors["votes"][0, 0, 1].item() == pytest.approx(0.5)


def test_compact_keeps_each_rows_own_count_in_slot_order():
    buf = filled(capacity=6, rows=2, heads=1)
    kept = torch.tensor([[[False, True, True, False, True, True]],
                         [[True, False, False, True, False, False]]])
    buf.compact(kept, torch.tensor([4, 2]), width=2)
    positions = buf.tensors["positions"][:, 0]
    assert positions[0, :4].tolist() == [4, 1, 2, 5]  # holes 0 and 3 take slots 4 and 5
    assert positions[1, :2].tolist() == [0, 3]


def test_select_rows_reset_and_copy():
    buf = filled(rows=3)
    buf.tensors["positions"][1] += 100
    buf.select_rows(torch.tensor([1, 0]))
    assert buf.tensors["positions"][:, 0, 0].tolist() == [100, 0] and buf.tensors["keys"].shape[0] == 2
    other = filled(rows=2)
    assert buf.same_shapes(other)
    keys = buf.tensors["keys"]
    buf.reset()
    assert buf.tensors["keys"] is keys and not keys.any()
    assert bool((buf.tensors["positions"] == EMPTY_POSITION).all()) and bool((buf.tensors["tags"] == -1).all())
    buf.copy_from(other)
    assert buf.tensors["keys"] is keys and all(torch.equal(buf.tensors[n], other.tensors[n]) for n in buf.tensors)


def test_take_names_the_missing_buffer():
    buf = SlotBuffers(4, 0, state_buffers(("votes",)))
    x = torch.zeros(1, 1, 3, 2)
    with pytest.raises(ValueError, match=r"^tensors: expected the buffers \['keys', 'values', 'positions', 'votes'\]"):
        buf.take({"keys": x, "values": x, "positions": x[..., 0]})


def narrow_values_model():
    """A tiny random DeepSeek-V3 (multi-head latent attention): its cached values are narrower than its keys."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                           n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2, kv_lora_rank=16,
                           q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=4,
                           max_position_embeddings=512, attn_implementation="sdpa")
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(cfg).eval()


def test_kv_bytes_count_values_at_their_own_width():
    """``kv_cache_bytes`` and ``peak_kv_bytes`` count a token's key plus its value, each at its own width (a formula
    that doubled the keys over-counted this model's cache), in a run and in a batch row: the peak is the N + B
    tokens held during a chunk's forward (the buffers allocated, ``kv_buffer_bytes``), the end the N kept."""
    model = narrow_values_model()
    eng = Engine(model, get_policy("keydiff"), EngineConfig(budget=20, chunk_size=8))
    res = eng.generate(prompt(50), max_new_tokens=4)
    layers = res.state.cache.layers
    assert layers[0].values.shape[-1] < layers[0].keys.shape[-1]
    want = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    assert res.stats.peak_kv_bytes == res.stats.kv_buffer_bytes == want  # N + B slots, allocated once, all held
    assert res.stats.kv_cache_bytes == want * 20 // (20 + 8)  # the N tokens kept at the end
    [row] = eng.generate_batch([prompt(50)[0]], max_new_tokens=4)
    assert row.tokens == res.tokens and row.stats.peak_kv_bytes == want  # its own tokens, as alone
    assert row.stats.kv_cache_bytes == res.stats.kv_cache_bytes
