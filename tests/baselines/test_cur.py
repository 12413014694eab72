"""CUR: squared key and value norms, each a share of its window of positions, against the prefill's form (windows
of consecutive tokens, padded at the end) computed on tokens in position order; the slot store's order must not
matter."""
import pytest
import torch
import torch.nn.functional as F

from kdeval.baselines import get_policy
from kdeval.keydiff.policy.interface import ScoreContext


def windowed(x, w):
    """The prefill's form: ``x [b, h, n]`` in position order, each entry over its window's sum."""
    b, h, n = x.shape
    padded = F.pad(x, (0, (w - n % w) % w)).reshape(b, h, -1, w)
    return (padded / padded.sum(-1, keepdim=True)).reshape(b, h, -1)[:, :, :n]


@pytest.mark.parametrize("leverage", ["key", "value", "kv_avg", "kv_product"])
def test_scores_are_the_windowed_leverages_whatever_the_slot_order(leverage):
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(1, 2, 37, 8, generator=g, dtype=torch.float64), torch.randn(1, 2, 37, 8, generator=g,
                                                                                         dtype=torch.float64)
    k2, v2 = windowed(keys.pow(2).sum(-1), 16), windowed(values.pow(2).sum(-1), 16)
    want = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[leverage]
    slots = torch.randperm(37, generator=g)  # the slot store keeps tokens out of order
    positions = slots.view(1, 1, -1).expand(1, 2, -1)
    ctx = ScoreContext(0, positions, 37, 37, values=values[:, :, slots])
    got = get_policy("cur", leverage_type=leverage).score(keys[:, :, slots], ctx)
    torch.testing.assert_close(got, want[:, :, slots], rtol=2.0**-16, atol=0)  # rounded to 16 significant bits


def test_scores_within_rounding_noise_tie_exactly():
    """A repeated token: the same key rotated to two positions, its norm a float32 unit or two apart."""
    from kdeval.baselines.ties import significant_bits

    x = torch.tensor([0.009619272314, 0.009619273245, 0.009621])
    got = significant_bits(x, 16)
    assert got[0] == got[1] and got[1] < got[2]


def test_empty_slots_score_zero_not_nan():
    keys = torch.cat([torch.randn(1, 1, 5, 4), torch.zeros(1, 1, 3, 4)], dim=2)
    positions = torch.tensor([[[0, 1, 2, 3, 4] + [2**62] * 3]])
    ctx = ScoreContext(0, positions, 5, 5, values=keys.clone())
    got = get_policy("cur").score(keys, ctx)
    assert torch.isfinite(got).all() and (got[0, 0, 5:] == 0).all()


def test_random_leverage_is_seeded_per_layer():
    keys = torch.randn(1, 2, 20, 8)
    ctx = lambda layer: ScoreContext(layer, torch.arange(20).expand(1, 2, -1), 20, 20, values=keys.flip(2))
    a, b = (get_policy("cur", use_random_leverage=True, seed=s) for s in (0, 1))
    assert torch.equal(a.score(keys, ctx(0)), a.score(keys, ctx(0)))
    assert not torch.equal(a.score(keys, ctx(0)), b.score(keys, ctx(0)))
    assert not torch.equal(a.score(keys, ctx(0)), a.score(keys, ctx(1)))


@pytest.mark.parametrize("params, message", [
    (dict(leverage_type="kv"), "leverage_type: expected one of"),
    (dict(local_window_size=0), "local_window_size: must be an integer > 0, got 0"),
    (dict(num_sinks=-1), "num_sinks: must be an integer >= 0, got -1"),
])
def test_bad_parameters_name_the_field(params, message):
    with pytest.raises(ValueError, match=message):
        get_policy("cur", **params)
