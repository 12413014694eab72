"""The quantized store's record (kdeval/keydiff/quant/packed.py): codes packed and unpacked exactly, and after every step
of chunked runs with eviction (slot cache, head-shared pool, ragged batch, a re-rotating and a merging policy) the
record holds exactly the held tokens below the frontier, once each, dequantizes bit for bit to what the buffers
hold, and its bytes are the analytical figure of a store of codes."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff.quant.store import QuantizedStore
from kdeval.keydiff.quant.packed import LayerRecord, pack, packed_width, token_keys, unpack
from kdeval.keydiff.quant.rule import KVQuant

from .helpers import make_engine, prompt, tiny


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_round_trip(bits):
    g = torch.Generator().manual_seed(bits)
    for n in (16, 7, 1):  # 7, 1: a row padded to whole bytes
        codes = torch.randint(0, 2**bits, (3, 5, n), generator=g).to(torch.uint8)
        packed = pack(codes, bits)
        assert packed.dtype == torch.uint8 and packed.shape == (3, 5, packed_width(n, bits))
        assert packed_width(n, bits) == -(-n * bits // 8)
        assert torch.equal(unpack(packed, bits, n), codes)
    edge = torch.tensor([[0, 2**bits - 1] * 4], dtype=torch.uint8)
    assert torch.equal(unpack(pack(edge, bits), bits, 8), edge)
    if bits == 4:  # the first code in the low bits
        assert pack(torch.tensor([[1, 2]], dtype=torch.uint8), 4).tolist() == [[0x21]]


# ---------------------------------------------------------------------- the record after every step


def held_slots(cache, seen):
    """Per layer, per batch row: (keys [k, d], values [k, dv], record keys [k], quantized [k] bool) of its held
    slots (``seen``: per row)."""
    out = []
    for l, layer in enumerate(cache.layers):
        rows = []
        for r in range(len(seen)):
            if hasattr(cache, "lengths"):  # a ragged batch: row r holds [0, lengths[r])
                n = cache.lengths[l][r]
                keys, positions = layer.keys[r, :, :n], layer.positions[r, :, :n]
            else:
                keys, positions, _ = layer.view()
                keys, positions = keys[r], positions[r]
            values = layer.values[r, :, : keys.shape[1]]
            if hasattr(layer, "tags"):  # a head-shared pool: each slot's KV head
                heads, num_heads = layer.tags[r, :, : keys.shape[1]], layer.heads
            else:
                heads, num_heads = torch.arange(keys.shape[0]).view(-1, 1).expand_as(positions), keys.shape[0]
            rows.append((keys.reshape(-1, keys.shape[-1]), values.reshape(-1, values.shape[-1]),
                         token_keys(r * num_heads + heads.reshape(-1), positions.reshape(-1)),
                         positions.reshape(-1), num_heads))
        out.append(rows)
    return out


def analytical_bytes(q: KVQuant, rows, item: int) -> int:
    """The formula the store counted before it kept a record: payload + scales + zeros of the quantized tokens,
    the live key groups' scales under kivi, the rest at full width."""
    total = 0
    for keys, values, tokens, quantized in rows:
        d, dv = keys.shape[-1], values.shape[-1]
        n_q = int(quantized.sum())
        key_tok, _ = q.token_bytes(d, item)
        _, value_tok = q.token_bytes(dv, item)
        total += n_q * (key_tok + value_tok) + (tokens.numel() - n_q) * (d + dv) * item
        groups = torch.unique(((tokens >> 32) << 32 | (tokens & 0xFFFFFFFF) // q.group_size)[quantized])
        total += groups.numel() * q.key_group_bytes(d, item)
    return int(round(total))


class RecordCheck:
    """Checks a cache's record after every step; ``first``: each quantized token's stored key and value when it
    was first seen (by request, KV head, position), to catch a token quantized twice."""

    def __init__(self, quant: dict, keys_rewritten: bool = False, values_rewritten: bool = False):
        self.q = KVQuant.of(quant)
        self.keys_rewritten, self.values_rewritten = keys_rewritten, values_rewritten
        self.first: dict = {}
        self.steps = self.quantized = 0

    def __call__(self, cache, seen: list[int], requests: list[int]) -> None:
        self.steps += 1
        for l, rows in enumerate(held_slots(cache, seen)):
            record: LayerRecord = cache.kv_store.records[l]
            want, frontier = [], []
            for r, (keys, values, tokens, positions, heads) in enumerate(rows):
                quantized = positions < self.q.frontier(seen[r])
                frontier.append(quantized)
                want.append(tokens[quantized])
            want = torch.cat(want).sort().values
            assert torch.equal(record.tokens, want), "the record holds exactly the held tokens below the frontier"
            for r, (keys, values, tokens, positions, heads) in enumerate(rows):
                q_at = frontier[r]
                if not q_at.any():
                    continue
                k, v = record.dequantized(tokens[q_at])
                assert torch.equal(k, keys[q_at]) and torch.equal(v, values[q_at]), "bit for bit as the buffers"
                self.quantized += int(q_at.sum())
                for key, kk, vv in zip(((tokens[q_at] >> 32) % heads * 2**32 + (tokens[q_at] & 0xFFFFFFFF)).tolist(),
                                       k, v):
                    was = self.first.setdefault((requests[r], l, key), (kk.clone(), vv.clone()))
                    assert self.keys_rewritten or torch.equal(was[0], kk), "a key quantized twice"
                    assert self.values_rewritten or torch.equal(was[1], vv), "a value quantized twice"
            item = rows[0][0].element_size()
            analytic = analytical_bytes(self.q, [(*row[:3], fq) for row, fq in zip(rows, frontier)], item)
            assert cache.kv_store.held[l] == analytic == record.nbytes() + sum(
                row[2].numel() - int(fq.sum()) for row, fq in zip(rows, frontier)) * (
                rows[0][0].shape[-1] + rows[0][1].shape[-1]) * item

    def on_step(self, state) -> None:
        self(state.cache, [state.seen] * state.cache.layers[0].keys.shape[0], list(range(64)))

    def on_batch_step(self, view) -> None:
        self(view.cache, view.seen, view.requests)


KIVI = {"group_size": 4, "window": 8, "scheme": "kivi"}
PER_TOKEN = {"group_size": 8, "window": 6, "scheme": "per_token"}


def model(dtype="float32"):
    return tiny("random:llama-tiny", 2, dtype)  # head_dim 16, 3 layers, 2 KV heads


CASES = [  # policy, scheme, bits, model dtype, what the policy rewrites (keys, values)
    *[("keydiff", "kivi", b, "float32", False, False) for b in (2, 4, 8)],  # the slot cache
    ("keydiff", "per_token", 4, "float32", False, False),
    ("keydiff", "kivi", 4, "bfloat16", False, False),  # a 2-byte width
    ("ada-keydiff", "kivi", 2, "float32", False, False),  # a head-shared pool
    ("ada-keydiff", "per_token", 8, "float32", False, False),
    ("sink-rerotate", "kivi", 8, "float32", True, True),  # re-rotated: every entry rewritten, values too
    ("sink-rerotate", "per_token", 2, "float32", True, True),
    ("merging", "kivi", 4, "float32", False, True),  # merged values rewritten
    ("merging", "per_token", 2, "float32", False, True),
]
SCHEMES = {"kivi": KIVI, "per_token": PER_TOKEN}


@pytest.mark.parametrize("policy, scheme, bits, dtype, keys_rewritten, values_rewritten", CASES)
def test_the_record_is_the_buffers_after_every_step(policy, scheme, bits, dtype, keys_rewritten, values_rewritten):
    """A chunked prompt with eviction then decoding: after every step each layer's record holds exactly the held
    tokens below the frontier, they dequantize bit for bit to the buffers, no token changes unless the policy
    rewrote it (nothing is quantized twice), and the held bytes are the analytical figure."""
    quant = dict(SCHEMES[scheme], bits=bits)
    check = RecordCheck(quant, keys_rewritten, values_rewritten)
    eng = make_engine(model(dtype).model, get_policy(policy), check.on_step, budget=20, chunk_size=12,
                      kv_quant=quant)
    res = eng.generate(prompt(36, seed=bits), max_new_tokens=3)
    assert check.steps == 3 + 2 and check.quantized > 0
    assert res.stats.kv_cache_bytes == sum(res.state.cache.kv_store.held)


@pytest.mark.parametrize("scheme", [KIVI, PER_TOKEN], ids=["kivi", "per_token"])
def test_a_ragged_batch_keeps_each_rows_record(scheme):
    """Prompts of other lengths, one after a quantized prefilled state (its record loaded into its row), rows
    leaving as they finish: after every step the batch's record is its rows' held tokens; each result's state
    carries its row's record as row 0, which a batch-1 continuation keeps."""
    quant = dict(scheme, bits=4)
    lm = model()
    check = RecordCheck(quant)
    eng = make_engine(lm.model, get_policy("keydiff"), budget=16, chunk_size=8, kv_quant=quant,
                      on_batch_step=check.on_batch_step)
    start = eng.prefill(prompt(20, seed=7))
    RecordCheck(quant).on_step(start)
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (21, 37, 5)]
    results = eng.generate_batch(ps, max_new_tokens=[2, 4, 6], states=[None, None, start])
    assert check.steps > 5 and check.quantized > 0
    for res in results:
        RecordCheck(quant).on_step(res.state)
    after = RecordCheck(quant)
    cont = make_engine(lm.model, get_policy("keydiff"), after.on_step, budget=16, chunk_size=8, kv_quant=quant)
    cont.generate(prompt(10, seed=9), max_new_tokens=2, state=results[1].state)
    assert after.steps == 2 + 1  # two chunks, one decode step


def test_a_broken_store_is_caught():
    """The checks fail for a store that keeps evicted tokens in its record or quantizes its tokens again after
    eviction changed their key groups, and the record refuses a token added twice."""
    quant = dict(KIVI, bits=2)
    keep = LayerRecord.keep
    LayerRecord.keep = lambda self, held: None  # evicted tokens stay
    try:
        check = RecordCheck(quant)
        eng = make_engine(model().model, get_policy("keydiff"), check.on_step, budget=16, chunk_size=8,
                          kv_quant=quant)
        with pytest.raises(AssertionError, match="exactly the held tokens"):
            eng.generate(prompt(28), max_new_tokens=1)
    finally:
        LayerRecord.keep = keep

    class Again(QuantizedStore):  # every held token below the frontier quantized again at every step
        def settle(self, layout, idx, requantize=False):
            super().settle(layout, idx, requantize=True)

    check = RecordCheck(quant)
    eng = make_engine(model().model, get_policy("keydiff"), check.on_step, budget=16, chunk_size=8, kv_quant=quant)
    eng.step.evictor.store = Again(eng.plan.kv_quant, eng.plan.num_layers)
    with pytest.raises(AssertionError, match="quantized twice"):
        eng.generate(prompt(28), max_new_tokens=3)

    record = LayerRecord(KVQuant.of(quant), 2, 16, 16, torch.float32, torch.device("cpu"))
    codes, scales = torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(1, 4)
    entry = (token_keys(torch.tensor([1]), torch.tensor([5])), codes, codes, scales, scales,
             torch.zeros(1, 16), torch.zeros(1, 16))
    record.add(*entry, groups=torch.tensor([(1 << 32) | 1]))
    assert record.count == 1 and record.nbytes() == 4 + 4 + 2 * 4 * 4 + 2 * 16 * 4
    with pytest.raises(RuntimeError, match="a token quantized twice"):
        record.add(*entry, groups=torch.tensor([(1 << 32) | 2]))
