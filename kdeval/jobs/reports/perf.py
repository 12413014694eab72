"""Speed and memory of one cell against its reference cell: a :class:`~kdeval.jobs.reports.report_rows.PerfRow`.

Speed ratios (TTFT, decode tokens/s) are ratios of medians over the samples both cells timed, paired by
sample key, with a bootstrap CI over those samples. TTFT is measured once per batch (every row of a batch
carries the batch's TTFT), so it counts one timing per batch (:func:`ttft_timings`): batches of the same
samples are paired, differently batched cells are resampled apart, and one timing cannot rank anything.
A ratio whose CI spans 1.0 cannot say which cell is faster: the row's ``speed_note`` says so, and the
report warns once (:func:`noisy_timing_warning`).
Memory ratios (peak KV bytes and tokens) are ratios of the maxima over samples (no sampling noise).
"""
from __future__ import annotations

import numpy as np

from kdeval.jobs.reports.report_rows import PerfRow, stored
from kdeval.jobs.reports.samples import LoadedCell, Slot
from kdeval.jobs.reports.stats import Interval, median_ratio_bootstrap, unpaired_median_ratio_bootstrap

#: The note of a speed ratio that cannot rank two cells.
TOO_NOISY = "too noisy to rank"


def _median(values: np.ndarray) -> float | None:
    v = values[~np.isnan(values)]
    return float(np.median(v)) if v.size else None


def _max(values: np.ndarray) -> float | None:
    v = values[~np.isnan(values)]
    return float(v.max()) if v.size else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _summary_number(cell: LoadedCell, key: str) -> float | None:
    """A number of the cell's summary (None when absent or not a number)."""
    value = (cell.view.summary or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def decode_rates(cell: LoadedCell) -> np.ndarray:
    """``[n]`` generated tokens / decode seconds per sample (NaN where not measurable)."""
    p = cell.perf
    gen, dec = p["generated_tokens"], p["decode_s"]
    ok = ~np.isnan(gen) & ~np.isnan(dec) & (dec > 0)
    return np.where(ok, gen / np.where(ok, dec, 1.0), np.nan)


def cell_perf(cell: LoadedCell | None) -> dict[str, float | None]:
    """Median TTFT (over batch timings), median decode tokens/s, max peak memory, KV bytes and KV tokens, median prompt length,
    model weight bytes. Per-sample rows first; the cell's index record where the rows lack a column."""
    if cell is None or cell.perf is None:
        return {}
    p = cell.perf
    memory = _max(p["peak_memory_bytes"])
    # a grouped cell's own record is its group's peak, not its own
    if memory is None and cell.view.peak_memory_bytes is not None and not _summary_number(cell, "shared_rows"):
        memory = float(cell.view.peak_memory_bytes)
    kv_bytes = _max(p["peak_kv_bytes"])
    if kv_bytes is None:
        kv_bytes = _summary_number(cell, "max_peak_kv_bytes")
    ttft = list(ttft_timings(cell).values()) if cell.samples is not None else []
    return {"ttft": float(np.median(ttft)) if ttft else None, "decode": _median(decode_rates(cell)),
            "memory": memory, "kv": _max(p["peak_kv_tokens"]), "kv_bytes": kv_bytes,
            "weights": _summary_number(cell, "model_weight_bytes"), "prompt_tokens": _median(p["prompt_tokens"]),
            "states": _max(p["state_bytes"])}


def _paired(own: LoadedCell, ref: LoadedCell, own_values: np.ndarray, ref_values: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The values of the samples present (and measured) in both cells, in the same order."""
    ref_at = {k: i for i, k in enumerate(ref.samples.key)}
    pairs = [(i, ref_at[k]) for i, k in enumerate(own.samples.key) if k in ref_at]
    oi = np.array([i for i, _ in pairs], dtype=int)
    ri = np.array([j for _, j in pairs], dtype=int)
    a, b = own_values[oi], ref_values[ri]
    ok = ~np.isnan(a) & ~np.isnan(b)
    return a[ok], b[ok]


def ttft_timings(cell: LoadedCell) -> dict[tuple[str, ...], float]:
    """One TTFT per batch (its slowest row's: every first token of the batch is out), keyed by the batch's
    sorted sample keys. Rows of one batch share a ``timing_batch`` number; in files written before rows
    carried it, the rows of a batch are those with the very same TTFT (one measurement copied to each row)."""
    ttft, batch = cell.perf["ttft_s"], cell.perf.get("timing_batch")
    groups: dict[tuple[str, float | None], list[int]] = {}
    for i, t in enumerate(ttft):
        if np.isnan(t):
            continue
        b = batch[i] if batch is not None and not np.isnan(batch[i]) else None
        groups.setdefault(("b", b) if b is not None else ("t", float(t)), []).append(i)
    return {tuple(sorted(str(cell.samples.key[i]) for i in idx)): float(ttft[idx].max()) for idx in groups.values()}


def ttft_ratio(cell: LoadedCell, ref: LoadedCell, **boot) -> tuple[Interval | None, int]:
    """TTFT ratio (median batch timing / the reference's) with its CI, and the number of timings behind it:
    batches of the same samples in both cells are paired; otherwise each cell's timings are resampled apart."""
    own, theirs = ttft_timings(cell), ttft_timings(ref)
    common = sorted(set(own) & set(theirs))
    if common and len(common) == len(own) == len(theirs):
        a, b = np.array([own[k] for k in common]), np.array([theirs[k] for k in common])
        return median_ratio_bootstrap(a, b, **boot), len(common)
    a, b = np.array(list(own.values())), np.array(list(theirs.values()))
    return unpaired_median_ratio_bootstrap(a, b, **boot), min(a.size, b.size)


def speed_note(n_paired: int, intervals: dict[str, Interval | None], ttft_timings_n: int | None = None) -> str:
    """Why the speed ratios cannot rank the cell against its reference ('' when they can).

    ``ttft_timings_n``: the batch timings behind the TTFT ratio (one cannot rank, whatever the samples)."""
    if 0 < n_paired < 2:
        return f"{TOO_NOISY} (1 sample)"
    if ttft_timings_n == 1 and intervals.get("TTFT") is not None:
        return f"{TOO_NOISY} (TTFT: 1 batch timing)"
    spanning = [iv for iv in intervals.values()  # a zero-width [1, 1] is a tie, not noise
                if iv is not None and iv.low <= 1.0 <= iv.high and iv.low < iv.high]
    return TOO_NOISY if spanning else ""


def perf_row(slot: Slot, cell: LoadedCell, ref: LoadedCell | None, *, resamples: int, seed: int,
             confidence: float, state: str) -> PerfRow:
    """Speed and memory of ``cell`` (at ``slot``) and their ratios to ``ref`` (None: no ratios)."""
    mine, theirs = cell_perf(cell), cell_perf(ref)

    def ratio(key: str) -> float | None:
        a, b = mine.get(key), theirs.get(key)
        return stored(a / b) if a is not None and b not in (None, 0) else None

    speed: dict[str, Interval | None] = {}
    n_paired, n_ttft = 0, None
    if cell.samples is not None and ref is not None and ref.samples is not None:
        boot = dict(resamples=resamples, seed=seed, confidence=confidence)
        ttft = _paired(cell, ref, cell.perf["ttft_s"], ref.perf["ttft_s"])
        rates = _paired(cell, ref, decode_rates(cell), decode_rates(ref))
        n_paired = int(max(ttft[0].size, rates[0].size))
        tt_interval, n_ttft = ttft_ratio(cell, ref, **boot)
        speed = {"TTFT": tt_interval, "tok/s": median_ratio_bootstrap(*rates, **boot)}
    tt, dr = speed.get("TTFT"), speed.get("tok/s")
    return PerfRow(
        model=slot.model, policy=slot.policy, budget=slot.budget, chunk=slot.chunk, task=slot.task,
        state=state, n=len(cell.samples) if cell.samples is not None else 0,
        prompt_tokens=_int(mine.get("prompt_tokens")),
        ttft_median_s=stored(mine.get("ttft")),
        decode_tok_s=stored(mine.get("decode")),
        peak_kv_bytes=_int(mine.get("kv_bytes")), peak_kv_tokens=_int(mine.get("kv")),
        peak_memory_bytes=_int(mine.get("memory")), memory_kind=cell.memory_kind,
        state_bytes=_int(mine.get("states")),
        model_weight_bytes=_int(mine.get("weights")), n_paired=n_paired,
        ttft_ratio=stored(tt and tt.estimate), ttft_ratio_low=stored(tt and tt.low),
        ttft_ratio_high=stored(tt and tt.high),
        decode_ratio=stored(dr and dr.estimate),
        decode_ratio_low=stored(dr and dr.low), decode_ratio_high=stored(dr and dr.high),
        speed_note=speed_note(n_paired, speed, n_ttft), timed_note=timed_note(cell),
        kv_bytes_ratio=ratio("kv_bytes"), kv_ratio=ratio("kv"),
    )


def timed_note(cell: LoadedCell) -> str:
    """What the cell's TTFT holds beyond its prompt (a repeat pass's extra forward tokens, KVzip's) and which
    samples its TTFT and decode speed come from when some have none: a cell run in a group times its first samples
    alone and computes the others with prompt steps shared among cells (their rows carry no TTFT), and may decode
    them in a batch with other cells (their rows carry no decode time)."""
    if cell.samples is None or cell.perf is None:
        return ""
    extra = cell.perf.get("extra_forward_tokens")
    extra = extra[~np.isnan(extra)] if extra is not None else np.array([])
    repeat = (f"TTFT includes {int(np.median(extra)):,} extra forward tokens a sample (median, from a repeat pass)"
              if extra.size and np.median(extra) > 0 else "")
    timed = _timed_samples(cell)
    return "; ".join(part for part in (repeat, timed) if part)  # the parts hold no "; " (the speed view splits)


def _timed_samples(cell: LoadedCell) -> str:
    """Which samples were timed alone, in words ("" when every sample or none has its timings)."""
    n = len(cell.samples)
    counts = {what: int((~np.isnan(cell.perf[col])).sum())
              for what, col in (("TTFT", "ttft_s"), ("decode speed", "decode_s"))}
    partial = [f"{what} of {k}/{n}" for what, k in counts.items() if 0 < k < n]
    if not counts["TTFT"] and n and (cell.view.summary or {}).get("shared_rows") == n:
        return "not timed: every sample ran with shared steps (execution: {time_first: false})"
    if not partial:
        return ""
    how = "shared steps" + (", decoded in a batch with other cells" if 0 < counts["decode speed"] < n else "")
    return f"{' and '.join(partial)} samples, timed alone (the others ran with {how})"


def noisy_timing_warning(rows: list[PerfRow], confidence: float) -> str | None:
    """One line when some speed ratios cannot rank their cells (None when every one can)."""
    timed = [r for r in rows if r.ttft_ratio is not None or r.decode_ratio is not None]
    noisy = [r for r in timed if r.speed_note]
    if not noisy:
        return None
    return (f"timing: {len(noisy)} of {len(timed)} cells' speed ratios are {TOO_NOISY} (a {int(confidence * 100)}% "
            f"CI spans 1.0, or one sample): no measured difference")
