"""Settings of a grid that would take no effect, found at submit (``--dry-run`` included), one line each
naming the field:

- said in a note: a ``kv_quant`` window that covers a budget (at some chunk size of the grid). The cache peaks
  (N kept tokens and a chunk of B incoming) at the first chunk after the budget fills, ``s = ceil(N / B) * B``
  tokens in; when nothing is older than the window then (:func:`kdeval.cluster.catalog.kv_quant_frontier` of
  ``s`` is 0), the quantized cell's ``peak_kv_bytes`` are the unquantized one's. Not refused: the store still
  quantizes the kept tokens that later leave the window, which changes the answers and the cache after its
  peak. Checked for the policies that keep N tokens in every layer and KV head, fixed budgets and chunk sizes
  in tokens (a ``whole`` chunk peaks at its full prefill, quantized or not);
- refused (its cells would repeat others while claiming to measure something else): a chunk size that holds
  every prompt of the grid in one chunk beside ``whole``, which does the same. A synthetic task's prompt and
  generation fit its target length (:func:`kdeval.evals.tasks.synthetic.fit_units`), so a chunk of at least
  the longest length is one chunk for every cell. Checked only when every task has target lengths.
"""
from __future__ import annotations

from typing import Any

from kdeval.cluster import catalog
from kdeval.evals.task_run.chunking import WHOLE
from kdeval.evals.task_run.budget import is_share
from kdeval.jobs.grid.errors import GridIssue
from kdeval.jobs.grid.fit import resolved_quant
from kdeval.jobs.grid.schema import BUDGET_FREE_POLICIES, GridSpec


def _tokens(values: list[Any]) -> list[tuple[int, int]]:
    """(index, value) of the entries that are a number of tokens (not a share, not ``whole``)."""
    return [(k, v) for k, v in enumerate(values)
            if isinstance(v, int) and not isinstance(v, bool) and not is_share(v)]


def _first_full_step(budget: int, chunk: int) -> int:
    """Tokens fed when the cache first holds N kept tokens with a chunk of B coming: its peak."""
    return -(-budget // chunk) * chunk


def window_notes(grid: GridSpec, model_shapes: list[Any]) -> list[str]:
    """``kv_quant`` entries whose full-precision window covers a budget at some chunk (module docstring)."""
    if not any(catalog.policy_keeps_budget_per_head(p.name, dict(p.params)) for p in grid.policies
               if p.name not in BUDGET_FREE_POLICIES):
        return []
    budgets, chunks = _tokens(grid.budgets), [c for _, c in _tokens(grid.chunk_sizes)]
    notes = []
    for j, quant in enumerate(grid.kv_quant):
        if quant is None:
            continue
        fields = [resolved_quant(quant, shape).model_dump() for shape in model_shapes]
        covered = [(k, budget, c) for k, budget in budgets for c in chunks
                   if any(catalog.kv_quant_frontier(f, _first_full_step(budget, c)) == 0 for f in fields)]
        covered = [(k, b, c) for n, (k, b, c) in enumerate(covered) if all(k != e[0] for e in covered[:n])]
        if covered:
            named = ", ".join(f"budgets[{k}] {b} (at chunk {c})" for k, b, c in covered)
            least = min(b for _, b, _ in covered)
            notes.append(
                f"kv_quant[{j}].window: {quant.window} recent tokens in full precision cover {named}: the "
                "cache peaks (N kept + a chunk of B) before any kept token is older than the window, so "
                f"those {quant.bits}-bit cells' peak_kv_bytes are the unquantized ones'; a window below "
                f"{least} makes the store smaller at its peak")
    return notes


def chunk_issues(grid: GridSpec) -> list[GridIssue]:
    """Chunk sizes that hold every prompt in one chunk beside ``whole`` (module docstring)."""
    if WHOLE not in grid.chunk_sizes or not grid.tasks or any(not t.lengths for t in grid.tasks):
        return []
    longest = max(max(t.lengths) for t in grid.tasks)
    whole = grid.chunk_sizes.index(WHOLE)
    return [GridIssue(f"chunk_sizes[{k}]", f"{c} tokens per chunk hold every prompt of the grid in one chunk "
                      f"(the longest task length is {longest}), as 'whole' (chunk_sizes[{whole}]) does: its "
                      f"cells would repeat whole's; expected a chunk below {longest}")
            for k, c in _tokens(grid.chunk_sizes) if c >= longest]


def no_effect_issues(grid: GridSpec) -> list[GridIssue]:
    """Every setting of ``grid`` that would take no effect and is refused, each at its path."""
    return chunk_issues(grid)
