"""The KeyDiff paper's claims, checked claim by claim against a leaderboard (bench/results_page.py draws the page).

1. Under chunked prefill, KeyDiff keeps scores near the full cache where TOVA, SnapKV, H2O and StreamingLLM fall:
   per model × task instance × budget, KeyDiff − the best of those baselines, paired by sample id, with a
   bootstrap CI (supported when the CI is above 0, contradicted when below, unresolved when it spans 0).
2. The gap grows with the context: per model × task × budget run at several lengths, the claim-1 margin at the
   longest length against the shortest (supported when the longest's CI lies wholly above the shortest's).
3. A sliding window helps reasoning: KeyDiff with ``window_fraction`` − plain KeyDiff on a reasoning task
   (MATH-500, AIME), paired by sample; other tasks are shown too, but only a reasoning task decides the claim.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from kdeval.jobs.reports.leaderboard.build import Leaderboard, LeaderboardRow
from kdeval.jobs.reports.render.units import MIN_CI_SAMPLES
from kdeval.jobs.reports.samples import Samples, paired_delta, task_of_label

BASELINES = ("tova", "snapkv", "h2o", "sink")
REASONING = ("math500", "aime2025")
SUPPORTED, CONTRADICTED, UNRESOLVED, UNTESTED = "supported", "contradicted", "not resolved", "not tested"
#: Fewer pairs than this and a margin decides nothing (the reports' † threshold).
MIN_PAIRS = MIN_CI_SAMPLES


@dataclass(frozen=True)
class Finding:
    """One piece of evidence for a claim: where, what was compared, the paired margin and its verdict."""

    claim: int
    where: str                 # "smollm2-135m ruler.niah_single_1@2048#s0 N=256"
    compared: str              # "keydiff − snapkv(window=32) (the best baseline)"
    margin: float | None = None  # points
    low: float | None = None
    high: float | None = None
    n: int = 0
    detail: str = ""           # each side's score and Δ vs full
    verdict: str = UNTESTED


def name_of(row: LeaderboardRow) -> str:
    """The policy's registry name (``snapkv`` from ``snapkv(window=32) [query-agnostic]``)."""
    return row.policy.split("(")[0].split(" [")[0]


def _verdict(low: float | None, high: float | None) -> str:
    if low is None:
        return UNTESTED
    return SUPPORTED if low > 0 else CONTRADICTED if high < 0 else UNRESOLVED


def _side(r: LeaderboardRow) -> str:
    delta = "" if r.delta is None else f" (Δ vs full {r.delta:+.1f} [{r.ci_low:.1f}, {r.ci_high:.1f}])"
    return f"{r.policy} {r.value:.1f}{delta}"


def _paired(claim: int, where: str, compared: str, a: LeaderboardRow, b: LeaderboardRow,
            samples: Callable[[str], Samples], **boot) -> Finding:
    d = paired_delta(samples(a.cell), samples(b.cell), False, **boot)
    detail = f"{_side(a)}; {_side(b)}"
    if d.ci is None:
        return Finding(claim, where, compared, detail=detail + "; no samples pair")
    verdict = _verdict(d.ci.low, d.ci.high) if d.paired.n >= MIN_PAIRS else f"{UNRESOLVED} (fewer than {MIN_PAIRS} pairs)"
    return Finding(claim, where, compared, d.ci.estimate, d.ci.low, d.ci.high, d.paired.n, detail, verdict)


def claim_keydiff_vs_baselines(board: Leaderboard, samples: Callable[[str], Samples], **boot) -> list[Finding]:
    """Claim 1, per model × task instance × budget (plain KeyDiff against the best-scoring baseline)."""
    groups: dict[tuple, list[LeaderboardRow]] = defaultdict(list)
    for r in board.rows:
        if r.budget is not None and r.value is not None:
            groups[(r.model, r.task, r.budget, r.chunk)].append(r)
    out = []
    for (model, task, budget, chunk), rows in groups.items():
        keydiff = [r for r in rows if r.policy == "keydiff"]
        baselines = [r for r in rows if name_of(r) in BASELINES]
        if not keydiff or not baselines:
            continue
        best = max(baselines, key=lambda r: r.value)
        out.append(_paired(1, f"{model} {task} N={budget} B={chunk}", f"keydiff − {best.policy} (best baseline)",
                           keydiff[0], best, samples, **boot))
    return out


def claim_gap_grows(findings: list[Finding]) -> list[Finding]:
    """Claim 2, from claim 1's findings: the margin at the longest length against the shortest."""
    by_task: dict[tuple, list[tuple[int, Finding]]] = defaultdict(list)
    for f in findings:
        model, instance, budget, chunk = f.where.split(" ")
        length = int(instance.split("@")[1].split("#")[0]) if "@" in instance else 0
        by_task[(model, task_of_label(instance), budget, chunk)].append((length, f))
    out = []
    for (model, task, budget, chunk), items in by_task.items():
        if len({length for length, _ in items}) < 2 or any(f.margin is None for _, f in items):
            continue
        (short_len, short), (long_len, long) = min(items, key=lambda x: x[0]), max(items, key=lambda x: x[0])
        grows = long.low > short.high
        shrinks = long.high < short.low
        out.append(Finding(2, f"{model} {task} {budget} {chunk}", f"margin at {long_len} − margin at {short_len}",
                           long.margin - short.margin, n=min(short.n, long.n),
                           detail=f"{short_len}: {short.margin:+.1f} [{short.low:.1f}, {short.high:.1f}]; "
                                  f"{long_len}: {long.margin:+.1f} [{long.low:.1f}, {long.high:.1f}]",
                           verdict=SUPPORTED if grows else CONTRADICTED if shrinks else UNRESOLVED))
    return out


def claim_window_helps(board: Leaderboard, samples: Callable[[str], Samples], **boot) -> list[Finding]:
    """Claim 3: KeyDiff with a sliding window − plain KeyDiff, per model × task instance × budget; only a
    reasoning task's finding counts for the claim (others are labelled as retrieval)."""
    out = []
    plain = {(r.model, r.task, r.budget, r.chunk): r for r in board.rows if r.policy == "keydiff"}
    for r in board.rows:
        if name_of(r) != "keydiff" or "window_fraction" not in r.policy:
            continue
        base = plain.get((r.model, r.task, r.budget, r.chunk))
        if base is None:
            continue
        f = _paired(3, f"{r.model} {r.task} N={r.budget} B={r.chunk}", f"{r.policy} − keydiff", r, base,
                    samples, **boot)
        reasoning = task_of_label(r.task) in REASONING
        out.append(f if reasoning else Finding(**{**f.__dict__, "verdict": f"{f.verdict} (retrieval: does not "
                                                                            f"decide the claim)"}))
    return out


CLAIMS = {1: "Under chunked prefill (B = 128) KeyDiff keeps scores near the full cache where TOVA, SnapKV, H2O "
             "and StreamingLLM fall",
          2: "KeyDiff's lead over the baselines grows with the context length",
          3: "A sliding window helps KeyDiff on reasoning"}


def overall(claim: int, findings: list[Finding]) -> str:
    """One verdict per claim: supported / contradicted where every deciding finding agrees, else mixed, or not
    tested when none decides it."""
    deciding = [UNRESOLVED if f.verdict.startswith(UNRESOLVED) and "retrieval" not in f.verdict else f.verdict
                for f in findings if f.claim == claim and "retrieval" not in f.verdict and f.verdict != UNTESTED]
    if not deciding:
        return UNTESTED
    if set(deciding) == {SUPPORTED}:
        return SUPPORTED
    if set(deciding) == {CONTRADICTED}:
        return CONTRADICTED
    if set(deciding) == {UNRESOLVED}:
        return UNRESOLVED
    counts = ", ".join(f"{deciding.count(v)} {v}" for v in (SUPPORTED, CONTRADICTED, UNRESOLVED) if v in deciding)
    return f"mixed ({counts})"
