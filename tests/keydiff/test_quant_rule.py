"""The quantize/dequantize rule (kdeval/keydiff/quant/rule.py) against a float64 oracle written from its definition
(loops over groups, numpy), and the setting's checks."""
import numpy as np
import pytest
import torch

from kdeval.keydiff.quant.rule import KVQuant, per_channel_roundtrip, per_token_roundtrip


def oracle_group(x: np.ndarray, bits: int) -> np.ndarray:
    """One group: zero = min, scale = (max - min) / (2^b - 1), code = clamp(round((x - zero) / scale))."""
    levels = 2**bits - 1
    lo, hi = x.min(), x.max()
    scale = (hi - lo) / levels
    if scale == 0:
        return np.full_like(x, lo)
    codes = np.clip(np.round((x - lo) / scale), 0, levels)
    return codes * scale + lo


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_per_token_matches_the_oracle(bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64)
    x[0, 0, 0, :8] = 0.25  # a constant group: scale 0
    got = per_token_roundtrip(x, 8, bits).numpy()
    want = np.empty_like(got)
    xs = x.numpy()
    for idx in np.ndindex(*xs.shape[:3]):
        for c in range(0, 16, 8):
            want[idx][c : c + 8] = oracle_group(xs[idx][c : c + 8], bits)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.all(got[0, 0, 0, :8] == 0.25)
    levels = {len(np.unique(got[idx][c : c + 8])) for idx in np.ndindex(*xs.shape[:3]) for c in (0, 8)}
    assert max(levels) <= 2**bits


@pytest.mark.parametrize("bits", [2, 4])
def test_per_channel_groups_match_the_oracle(bits):
    """KIVI's keys: each (row, head, group of positions, channel) over the chosen slots only, slots in any order."""
    g = torch.Generator().manual_seed(10 + bits)
    x = torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64)
    groups = torch.tensor([2, 0, 1, 0, 2, 1, 0, 2, 1, 0, 1, 2]).view(1, 1, 12).expand(1, 2, 12)
    chosen = torch.ones(1, 2, 12, dtype=torch.bool)
    chosen[0, 1, 3] = False  # not quantized, and left out of its group's range
    got = per_channel_roundtrip(x, groups, chosen, 3, bits).numpy()
    xs, gs, cs = x.numpy(), groups.numpy(), chosen.numpy()
    want = xs.copy()
    for h in range(2):
        for grp in range(3):
            slots = np.nonzero((gs[0, h] == grp) & cs[0, h])[0]
            for c in range(4):
                want[0, h, slots, c] = oracle_group(xs[0, h, slots, c], bits)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert got[0, 1, 3].tolist() == xs[0, 1, 3].tolist()


def test_scales_are_stored_at_the_cache_width():
    """A float16 cache: the result is what float16 scale and zero dequantize to (codes from the stored ones)."""
    x = torch.randn(1, 1, 3, 8, generator=torch.Generator().manual_seed(1)).half()
    got = per_token_roundtrip(x, 8, 4)
    lo, hi = x.float().amin(-1, keepdim=True), x.float().amax(-1, keepdim=True)
    zero = lo.half().float()
    scale = ((hi - zero) / 15).half().float()
    codes = torch.round((x.float() - zero) / scale).clamp(0, 15)
    assert torch.equal(got, (codes * scale + zero).half())


def test_frontier_and_bytes_by_hand():
    q = KVQuant(bits=4, group_size=8, window=16, scheme="kivi")
    assert [q.frontier(s) for s in (10, 16, 23, 24, 40)] == [0, 0, 0, 8, 24]  # whole key groups past the window
    p = KVQuant(bits=2, group_size=8, window=16, scheme="per_token")
    assert [p.frontier(s) for s in (10, 23, 40)] == [0, 7, 24]
    # head_dim 16 in float16: 16 x 4 bits = 8 bytes of codes; per-token groups 2 x (scale + zero) x 2 bytes = 8
    assert q.token_bytes(16, 2) == (8.0, 16.0) and q.key_group_bytes(16, 2) == 64
    assert p.token_bytes(16, 2) == (12.0, 12.0) and p.key_group_bytes(16, 2) == 0


@pytest.mark.parametrize("fields, message", [
    ({"bits": 3}, "bits: expected one of [2, 4, 8], got 3"),
    ({"bits": True}, "bits: expected one of [2, 4, 8], got True"),
    ({"group_size": 0}, "group_size: expected a positive number of elements per group, got 0"),
    ({"window": -1}, "window: expected a number of recent tokens >= 0, got -1"),
    ({"scheme": "kivy"}, "scheme: expected one of ['kivi', 'per_token'], got 'kivy'"),
    ({"bit": 4}, "bit: unknown field; expected some of ['bits', 'group_size', 'window', 'scheme']"),
])
def test_bad_settings_name_the_field(fields, message):
    with pytest.raises(ValueError) as e:
        KVQuant.of(fields)
    assert str(e.value) == message
