"""The invariant matrix: every check of :mod:`kdeval.baselines.checks.invariants` on tiny random models of three
families (a Llama shape, a hybrid with windowed layers, multi-head latent attention), in the dtypes each check is
exact in. What a policy cannot run on (a family's layers refuse it) is one line, not a failure."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable

from kdeval.baselines.checks import invariants as inv
from kdeval.keydiff.plan.plan import latent_refusal, windowed_refusal
from kdeval.keydiff.policy.interface import Policy
from kdeval.zoo.loading import LoadedModel, load_model

#: family -> its tiny random model (kdeval/zoo/random_models.py)
FAMILIES: dict[str, str] = {
    "llama": "random:llama-tiny",
    "gemma3 (windowed layers)": "random:gemma3-tiny",
    "deepseek-v3 (MLA)": "random:deepseek-v3-tiny",
}

#: families whose layers run no float64 (DeepSeek-V3's MLA projections): their equalities are checked in float32
FLOAT32_ONLY = {"deepseek-v3 (MLA)"}

#: check name -> (function, dtypes it runs in)
CHECKS: dict[str, tuple[Callable[[inv.Setup], str | None], tuple[str, ...]]] = {
    "N + B bound": (inv.bound, ("float32", "bfloat16")),
    "batch = each alone": (inv.batch_alone, ("float64",)),
    "chunked = one pass (no eviction)": (inv.chunked_one_pass, ("float64",)),
    "shared steps and forks = alone": (inv.shared_alone, ("float64",)),
    "deterministic, ties oldest first": (inv.deterministic, ("float32",)),
    "bfloat16 batch ~ alone": (inv.bf16_batch, ("bfloat16",)),
}


@dataclass(frozen=True)
class Finding:
    """One check on one family in one dtype: ``status`` is ``holds``, ``fails`` (``detail``: the first
    counterexample), ``refused`` (``detail``: the engine's one line) or ``error`` (the check raised)."""

    check: str
    family: str
    dtype: str
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("holds", "refused")


@functools.lru_cache(maxsize=None)
def tiny_model(model_id: str, dtype: str) -> LoadedModel:
    """A family's tiny random model on the CPU (built once per process and dtype)."""
    return load_model(model_id, device="cpu", dtype=dtype)


def refusal(policy: Policy, model_id: str) -> str | None:
    """Why the engine refuses ``policy`` on the layers of ``model_id`` (windowed, latent), in its words, else
    None."""
    from kdeval.zoo.model_config import model_shape

    shape = model_shape(model_id)
    needs = policy.needs()
    return (windowed_refusal(needs) if shape.windowed else None) or (latent_refusal(needs) if shape.latent else None)


def run_matrix(make_policy: Callable[[], Policy], families: Iterable[str] | None = None,
               checks: Iterable[str] | None = None, on_finding: Callable[[Finding], None] | None = None,
               dtypes: Iterable[str] | None = None) -> list[Finding]:
    """Every check of ``checks`` (default :data:`CHECKS`) on every family of ``families`` (default
    :data:`FAMILIES`), in each of the check's dtypes (only those of ``dtypes`` when given), for the policy
    ``make_policy`` builds (called afresh for every engine); ``on_finding`` is called as each finding is made."""
    findings: list[Finding] = []
    dtypes = None if dtypes is None else set(dtypes)

    def add(f: Finding) -> None:
        findings.append(f)
        if on_finding:
            on_finding(f)

    if not make_policy().evicts:
        return findings
    for family in families or FAMILIES:
        model_id = FAMILIES.get(family, family)
        refused = refusal(make_policy(), model_id)
        for check in checks or CHECKS:
            fn, own_dtypes = CHECKS[check]
            for dtype in own_dtypes:
                if dtypes is not None and dtype not in dtypes:
                    continue
                if refused:
                    add(Finding(check, family, dtype, "refused", " ".join(refused.split())))
                    continue
                if dtype == "float64" and family in FLOAT32_ONLY:
                    dtype = "float32"
                setup = inv.Setup(family, tiny_model(model_id, dtype), make_policy)
                try:
                    why = fn(setup)
                except Exception as e:  # noqa: BLE001 - the policy's own error is a finding, in one line
                    add(Finding(check, family, dtype, "error", f"{family}: {type(e).__name__}: "
                                                               f"{' '.join(str(e).split())}"))
                    continue
                add(Finding(check, family, dtype, "fails" if why else "holds", why or ""))
    return findings
