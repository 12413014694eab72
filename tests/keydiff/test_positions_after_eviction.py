"""After eviction, chunks are fed at their absolute positions: equal to a full forward with the evicted hidden."""
from dataclasses import dataclass

import pytest
import torch

from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.interface import Policy

from .helpers import prompt, tiny
from .oracles import STORES


@dataclass
class PositionHash(Policy):
    """Test-only policy: the same pseudo-random order of positions in every layer and head."""

    name = "test-position-hash"

    def score(self, keys, ctx):
        return ((ctx.positions * 7919) % 1009).float()


@pytest.mark.parametrize("store", ["slot", "gather"])
@pytest.mark.parametrize("model_name", ["random:llama-tiny", "random:qwen2-tiny"])
def test_chunk_logits_equal_masked_full_forward(store, model_name):
    lm = tiny(model_name)
    L, chunk, budget = 80, 16, 24
    ids = prompt(L, seed=4)
    kept_after: list[set[int]] = []

    def record(state):
        pos = state.cache.layers[0].view()[1]
        kept = set(pos[0, 0].tolist())
        for layer in state.cache.layers:  # the policy is position-only: all layers/heads agree
            for row in layer.view()[1].reshape(-1, budget if state.seen > budget else state.seen):
                assert set(row.tolist()) == kept
        kept_after.append(kept)

    eng = Engine(lm.model, PositionHash(), EngineConfig(budget=budget, chunk_size=chunk), on_step=record, **STORES[store])
    got = eng.prefill(ids, collect_logits=True).logits

    mask = torch.zeros(1, 1, L, L, dtype=torch.bool)
    for j, s in enumerate(range(0, L, chunk)):
        visible = set(range(s, s + chunk)) | (kept_after[j - 1] if j else set())
        for q in range(s, s + chunk):
            for k in visible:
                if k <= q:
                    mask[0, 0, q, k] = True
    ref = lm.model(ids, attention_mask=mask).logits
    assert (got - ref).abs().max().item() < 1e-4

    # Control: feeding the chunks at cache-length positions (what a naive loop does) gives other logits.
    naive = lm.model(ids, attention_mask=mask, position_ids=torch.tensor([[min(p, budget + p % chunk) for p in range(L)]])).logits
    assert (naive[:, 2 * chunk :] - ref[:, 2 * chunk :]).abs().max().item() > 1e-3
