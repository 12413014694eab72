"""The invariant matrix `kdeval check-policy` runs (kdeval/baselines/checks/) on every built-in policy: the bound
on the three families (a Llama shape, windowed layers, MLA; a family whose layers refuse the policy says so in one
line), and determinism with ties at the keep boundary declared (exact_ties). The batch, shared-step and fork
equalities of the built-ins are held by tests/baselines/test_policy_matrix.py, test_shared_steps.py and
test_fork_then_batch.py at more shapes than the matrix's; the matrix's own versions are tested on a few policies
here, and shown to catch what they are for."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kdeval.baselines import get_policy, policy_names
from kdeval.baselines.checks import CHECKS, FAMILIES, run_matrix
from kdeval.baselines.checks import invariants as inv
from kdeval.baselines.checks.matrix import tiny_model
from kdeval.keydiff.policy.interface import Policy

EVICTING = [n for n in policy_names() if n != "full"]


def _failures(findings):
    return [f for f in findings if not f.ok]


#: what the matrix finds broken in built-in policies today (policy -> family -> the error's start), each a bug
#: to fix in the engine or the policy (then its entry goes): these policies neither run on nor are refused by the
#: windowed layers of Gemma 3
KNOWN_BROKEN = {
    "compactor": {"gemma3 (windowed layers)": "RuntimeError: The expanded size of the tensor (4) must match"},
    "expected-attention": {"gemma3 (windowed layers)": "RuntimeError: The expanded size of the tensor (4) must match"},
    "think": {"gemma3 (windowed layers)": "RuntimeError: The expanded size of the tensor (4) must match"},
    "leverage": {"gemma3 (windowed layers)": "TypeError: Gemma3RotaryEmbedding.forward() missing 1 required "
                                             "positional argument: 'layer_type'"},
}


@pytest.mark.parametrize("policy", EVICTING)
def test_every_built_in_keeps_the_bound_on_every_family_and_is_deterministic(policy):
    findings = run_matrix(lambda: get_policy(policy), checks=["N + B bound", "deterministic, ties oldest first"],
                          dtypes=["float32"])
    assert len(findings) == 2 * len(FAMILIES)
    known = KNOWN_BROKEN.get(policy, {})
    broken = {f.family: f.detail for f in _failures(findings)}
    assert set(broken) == set(known), broken  # a fixed one: take it out of KNOWN_BROKEN
    for family, start in known.items():
        assert broken[family].startswith(f"{family}: {start}"), broken[family]


def test_a_refusing_family_is_one_line_not_a_failure():
    findings = run_matrix(lambda: get_policy("ada"), families=["gemma3 (windowed layers)"], checks=["N + B bound"])
    assert [f.status for f in findings] == ["refused", "refused"]
    assert all(f.ok and "\n" not in f.detail and "windowed" in f.detail for f in findings)


@pytest.mark.parametrize("policy", ["keydiff", "snapkv"])
def test_the_whole_matrix_holds_for_keydiff_and_snapkv_on_the_llama_shape(policy):
    findings = run_matrix(lambda: get_policy(policy), families=["llama"])
    assert len(findings) == sum(len(d) for _, d in CHECKS.values())
    assert not _failures(findings), _failures(findings)


@dataclasses.dataclass
class Tied(Policy):
    """Every token scores the same: the kept set is whichever slots the selection reaches first."""

    name = "tied-for-test"

    def score(self, keys: torch.Tensor, ctx) -> torch.Tensor:
        return torch.zeros(keys.shape[:3], dtype=torch.float32, device=keys.device)


@dataclasses.dataclass
class OverBudget(Policy):
    name = "over-budget-for-test"

    def score(self, keys: torch.Tensor, ctx) -> torch.Tensor:
        return keys.norm(dim=-1)

    def layer_budgets(self, budget: int, num_layers: int) -> list[int]:
        return [budget + 4] * num_layers


@dataclasses.dataclass
class PeeksAtTheBatch(Policy):
    """Scores a row by the whole batch's keys: a row's kept set then depends on the other rows."""

    name = "peeks-for-test"

    def score(self, keys: torch.Tensor, ctx) -> torch.Tensor:
        return (keys * keys.mean(dim=0, keepdim=True)).sum(-1)


def setup(policy_cls, dtype="float32"):
    return inv.Setup("llama", tiny_model(FAMILIES["llama"], dtype), policy_cls)


def test_the_checks_catch_what_they_are_for():
    assert inv.deterministic(setup(Tied)).startswith("llama, layer 0, step 3: positions ")
    assert "tie at score 0 at the keep boundary (N=40); declare PolicyNeeds(exact_ties=True)" in inv.deterministic(
        setup(Tied))
    assert inv.bound(setup(OverBudget)).startswith("llama, layer 0, step 3 (seen 48): the full layers hold [44, 44, "
                                                   "44] tokens per KV head, 132 in all, more than 3 layers x min(N=40, "
                                                   "seen) = 120; layer 0 keeps positions")
    why = inv.batch_alone(setup(PeeksAtTheBatch, "float64"))
    assert why.startswith("batch of 2: llama, layer 0, row 0: kept head ") and why.endswith("in the batch, alone")
    assert inv.bound(setup(lambda: get_policy("keydiff"))) is None
