"""Test-only pieces of the simulated nights: a workload that scores a policy's own rule, a policy that can be
weakened, and an executor that runs a run's cells in this process (no Ray), recording the provenance a
worker would.

The probe: per sample, ``T`` random keys around a shared direction plus one needle key pointing away from it
(by ``strength``); the sample scores 1 when the policy's ``score`` puts the needle among the ``N`` keys it
keeps. KeyDiff keeps outliers, so it finds the needle when it stands out; a policy that keeps the keys
*closest* to the mean never does. ``strength`` and ``night_seed`` play the stack under the policy: a weaker
needle is a numerics drift, a new seed is a nondeterministic night.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kdeval.baselines import get_policy
from kdeval.cluster import provenance
from kdeval.cluster.stub import StubModel
from kdeval.cluster.workload import CellResult, CellTask
from kdeval.keydiff.policy.keydiff import KeyDiff
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.storage import CellState, RunIndex, RunState
from tests.jobs.reports.helpers import record_done

TOKENS, DIM = 96, 16


@dataclass
class WeakenablePolicy(KeyDiff):
    """KeyDiff, or (``weakened``, set by a test) its inverse: it keeps the keys closest to the mean."""

    name: ClassVar[str] = "nightly-test-keydiff"
    rule: ClassVar[str] = "test only: KeyDiff, or its inverse when weakened"
    weakened: ClassVar[bool] = False

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        scores = super().score(keys, ctx)
        return -scores if type(self).weakened else scores


def use_weakenable(monkeypatch) -> None:
    """Register :class:`WeakenablePolicy` for one test; ``monkeypatch`` takes it out again after it. Registered when
    this module is imported, it would join every test collected later over all registered policies."""
    from kdeval.keydiff.policy import registry

    monkeypatch.setitem(registry._REGISTRY, WeakenablePolicy.name, WeakenablePolicy)


@dataclass
class ProbeWorkload:
    """Rows whose scores come from the cell's policy ranking synthetic keys (see the module docstring)."""

    strength: float = 1.0
    night_seed: int = 0
    jitter: float = 0.0

    def load(self, task: CellTask) -> StubModel:
        return StubModel(key=task.model_key)

    def _sample_keys(self, task: CellTask, i: int) -> tuple[torch.Tensor, int]:
        digest = hashlib.sha256(f"{task.task}/{task.length}/{task.seed}/{i}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        direction = torch.nn.functional.normalize(torch.randn(DIM, generator=g), dim=0)
        keys = torch.randn(1, 1, TOKENS, DIM, generator=g) + 2.0 * direction
        pos = int(torch.randint(8, TOKENS - 8, (1,), generator=g))
        keys[0, 0, pos] = torch.randn(DIM, generator=g) + (2.0 - self.strength * 2.0) * direction
        if self.jitter:  # this night's nondeterminism: the same sample, slightly different numbers
            night = torch.Generator().manual_seed(self.night_seed * 100_003 + i)
            keys = keys + self.jitter * torch.randn(keys.shape, generator=night)
        return keys, pos

    def run(self, handle: StubModel, task: CellTask) -> CellResult:
        policy = get_policy(task.policy, **task.policy_params)
        rows = []
        for i in range(task.samples):
            keys, pos = self._sample_keys(task, i)
            if policy.evicts:
                ctx = ScoreContext(layer_idx=0, positions=torch.arange(TOKENS).view(1, 1, -1), seen=TOKENS,
                                   n_new=TOKENS)
                kept = policy.score(keys, ctx)[0, 0].topk(int(task.budget)).indices.tolist()
                found = pos in kept
            else:
                found = True
            rows.append({"task": task.task, "id": f"probe-{i}", "prompt_hash": f"{i:016x}",
                         "prompt_tokens": TOKENS, "truncated": False, "prediction": str(found),
                         "references": ["True"], "score": float(found), "ttft_s": 0.01 + 0.001 * (i % 5),
                         "decode_s": 0.1, "generated_tokens": 4, "timing_batch": i,
                         "peak_kv_tokens": TOKENS if not policy.evicts else int(task.budget),
                         "peak_kv_bytes": 4 * DIM * (TOKENS if not policy.evicts else int(task.budget)),
                         "length": task.length, "depth": None, "meta_json": "{}"})
        score = 100.0 * sum(r["score"] for r in rows) / len(rows)
        return CellResult(rows=rows, summary={"score": score}, peak_memory_bytes=1 << 20)


def run_here(workload: ProbeWorkload, index: RunIndex, run_id: str, view: Any) -> None:
    """Run one cell in this process and record it done with the provenance a worker would collect
    (:func:`kdeval.cluster.provenance.collect_provenance`, looked up when called: tests replace it)."""
    from kdeval.jobs.grid.cells import CellSpec

    task = CellSpec.model_validate(view.spec).to_task()
    handle = workload.load(task)
    out = workload.run(handle, task)
    record_done(index, run_id, view.id, index.get_run(run_id).results_dir, out.rows,
                provenance=provenance.collect_provenance(task, handle), summary=out.summary)


class InProcessExecutor:
    """Stands in for ``service.execute_run``: runs a run's cells that are not done here (:func:`run_here`),
    one by one, and counts them."""

    def __init__(self, workload: ProbeWorkload) -> None:
        self.workload = workload
        self.computed: list[str] = []

    def __call__(self, index: RunIndex, run_id: str, address: Any = None, **_: Any) -> None:
        for view in index.run_cells(run_id):
            if view.state != CellState.DONE.value:
                run_here(self.workload, index, run_id, view)
                self.computed.append(view.id)
        index.set_run_state(run_id, RunState.DONE)
