"""The two questions only a chunked engine can answer, from the cells of the reported runs.

* **Cost of chunking**: per model × policy × budget × protocol × task, the score of chunked prefill (each chunk
  size B of the run) minus the score of one-shot compression (chunk size ``whole``: the whole compressed part
  in one chunk, what kvpress and the other tools do), paired by sample.
* **Query dependence**: per model × policy × budget × chunk × task, query-aware (``compress: prompt``, the
  question is compressed with the context) minus query-agnostic (``compress: context``), paired by sample.

Each row also gives both sides' peak KV-cache bytes and median TTFT. Rows exist only when the runs hold both
sides; lengths and seeds of a task are pooled (a sample pairs only with itself: the key names its instance).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from kdeval.evals.task_run.budget import budget_order
from kdeval.evals.task_run.chunking import chunk_text, is_whole
from kdeval.jobs.grid.cells import policy_label, store_label
from kdeval.jobs.grid.schema import COMPRESS_NAMES
from kdeval.jobs.reports.report_rows import ContrastRow, State, stored
from kdeval.jobs.reports.samples import LoadedCell, Samples, paired_delta


#: the setting of a cost-of-chunking row of a cell without a budget (``full``), under any protocol
NOTHING_EVICTED = "nothing evicted (any protocol)"


def protocol_of(cell: LoadedCell) -> tuple[str, str]:
    """(compress, decode) of a cell (the defaults, ``prompt``/``evict``, when its spec has none)."""
    p = (cell.view.spec or {}).get("protocol") or {}
    return str(p.get("compress", "prompt")), str(p.get("decode", "evict"))


def base_policy(cell: LoadedCell) -> str:
    """The policy label of a cell without its protocol, with its KV store when quantized (cells of other stores
    never pair)."""
    spec = cell.view.spec or {}
    store = store_label(spec)
    return policy_label(cell.view.policy, spec.get("policy_params") or {}) + (f" [{store}]" if store else "")


def _decode_note(decode: str) -> str:
    return "" if decode == "evict" else f", decode {decode}"


def _side(cells: list[LoadedCell]) -> tuple[Samples, int | None, float | None]:
    """The samples of some cells, their max peak KV bytes and median TTFT (None where not recorded)."""
    done = [c for c in cells if c.done]
    samples = Samples.concat([c.samples for c in done])
    kv = np.concatenate([c.perf["peak_kv_bytes"] for c in done]) if done else np.array([])
    ttft = np.concatenate([c.perf["ttft_s"] for c in done]) if done else np.array([])
    kv, ttft = kv[~np.isnan(kv)], ttft[~np.isnan(ttft)]
    return samples, (int(kv.max()) if kv.size else None), (float(np.median(ttft)) if ttft.size else None)


def _state(a: list[LoadedCell], b: list[LoadedCell]) -> str:
    cells = a + b
    if all(c.done for c in cells):
        return State.OK
    return State.PARTIAL if any(c.done for c in cells) else State.FAILED


def contrast_row(key: dict[str, Any], a: list[LoadedCell], b: list[LoadedCell], *, resamples: int, seed: int,
                 confidence: float) -> ContrastRow:
    """One row: ``a − b`` paired by sample (``key``: model, policy, budget, task, setting, a_label, b_label)."""
    sa, kva, ta = _side(a)
    sb, kvb, tb = _side(b)
    d = paired_delta(sa, sb, False, resamples=resamples, seed=seed, confidence=confidence)
    row = dict(key, state=_state(a, b), n_paired=d.paired.n, n_dropped=d.dropped, a_kv_bytes=kva, b_kv_bytes=kvb,
               a_ttft_s=stored(ta), b_ttft_s=stored(tb))
    if d.ci is None:
        return ContrastRow(**row, note="no paired samples")
    return ContrastRow(**row, a_value=stored(float(sa.score[d.paired.own].mean() * 100)),
                       b_value=stored(float(sb.score[d.paired.ref].mean() * 100)), delta=stored(d.ci.estimate),
                       ci_low=stored(d.ci.low), ci_high=stored(d.ci.high), note=d.note)


def group_cells(cells: Iterable[LoadedCell], key_of) -> dict[tuple, dict[Any, list[LoadedCell]]]:
    out: dict[tuple, dict[Any, list[LoadedCell]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        key, side = key_of(c)
        out[key][side].append(c)
    return out


def key_order(key: tuple) -> tuple:
    model, policy, budget, *rest = key
    return (model, policy, budget_order(budget), [str(x) for x in rest])


def cost_of_chunking(cells: Iterable[LoadedCell], **boot: Any) -> list[ContrastRow]:
    """Chunked − one-shot rows, one per chunk size B of each group that also ran ``whole``."""
    groups = group_cells(cells, lambda c: ((c.view.model, base_policy(c), c.view.grid_budget, *protocol_of(c), c.task),
                                       int(c.view.chunk_size)))
    rows = []
    for key in sorted(groups, key=key_order):
        model, policy, budget, compress, decode, task = key
        by_chunk = groups[key]
        whole = [c for chunk, cs in by_chunk.items() if is_whole(chunk) for c in cs]
        if not whole:
            continue
        for chunk in sorted(ch for ch in by_chunk if not is_whole(ch)):
            # a cell without a budget evicts nothing: no protocol changes its rows (its spec holds the default)
            protocol = COMPRESS_NAMES.get(compress, compress) + _decode_note(decode)
            setting = NOTHING_EVICTED if budget is None else protocol
            rows.append(contrast_row(dict(model=model, policy=policy, budget=budget, task=task, setting=setting,
                                          a_label=f"B={chunk}", b_label=chunk_text(0)),
                                     by_chunk[chunk], whole, **boot))
    return rows


def query_dependence(cells: Iterable[LoadedCell], **boot: Any) -> list[ContrastRow]:
    """Query-aware − query-agnostic rows, one per group that ran both."""
    def key_of(c: LoadedCell) -> tuple[tuple, str]:
        compress, decode = protocol_of(c)
        return (c.view.model, base_policy(c), c.view.grid_budget, int(c.view.chunk_size), decode, c.task), compress

    groups = group_cells(cells, key_of)
    rows = []
    for key in sorted(groups, key=key_order):
        model, policy, budget, chunk, decode, task = key
        sides = groups[key]
        if "prompt" in sides and "context" in sides:
            rows.append(contrast_row(dict(model=model, policy=policy, budget=budget, task=task,
                                          setting=f"B={chunk_text(chunk)}{_decode_note(decode)}",
                                          a_label=COMPRESS_NAMES["prompt"], b_label=COMPRESS_NAMES["context"]),
                                     sides["prompt"], sides["context"], **boot))
    return rows
