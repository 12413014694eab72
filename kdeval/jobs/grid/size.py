"""How big a grid is, measured before anything walks or expands it, so that a bomb is refused in milliseconds:

- :func:`expanded_values`: how many values the loaded YAML holds once its aliases are followed (``*a`` repeats
  what ``&a`` names: nine levels of ten aliases each are 10⁹ values in a file of a few hundred bytes). Counted
  with each shared node measured once, so the count itself costs only the file's own size.
- :func:`cell_count`: how many cells the grid expands to (models × chunk sizes × task instances × policies ×
  budgets × protocols × stores × conversations), multiplied out, not enumerated.

Either beyond its limit (:data:`MAX_GRID_VALUES`, :data:`MAX_GRID_CELLS`) is one :class:`GridIssue` naming the
size and the limit.
"""
from __future__ import annotations

from typing import Any

from kdeval.jobs.grid.errors import GridIssue
from kdeval.jobs.grid.schema import BUDGET_FREE_POLICIES, GridSpec

#: The most values (mappings, lists and scalars, aliases followed) a grid may hold: a 1 MiB grid file written
#: out holds fewer than this.
MAX_GRID_VALUES = 1_000_000
#: The most cells one grid may expand to (a paper-sized grid is about 10,000).
MAX_GRID_CELLS = 100_000


class _Cycle(Exception):
    """A YAML alias that refers to a node containing itself."""


def expanded_values(raw: Any, limit: int = MAX_GRID_VALUES) -> int:
    """How many values ``raw`` (a ``yaml.safe_load`` result) holds with aliases followed, counting stops a little
    past ``limit``; ``-1`` when an alias refers to a node that contains it (a cycle)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise _Cycle
        open_.add(key)
        total = 1
        for child in (node.values() if isinstance(node, dict) else node):
            total += size(child)
            if total > limit:
                break
        open_.discard(key)
        sizes[key] = total
        return total

    try:
        return size(raw)
    except (_Cycle, RecursionError):
        return -1


def values_issue(raw: Any) -> GridIssue | None:
    """The issue of a grid whose aliases expand beyond :data:`MAX_GRID_VALUES` values or refer to themselves."""
    n = expanded_values(raw)
    if n < 0:
        return GridIssue("", "a YAML alias refers to a node that contains it (or nesting is too deep); write the "
                             "grid's values out")
    if n > MAX_GRID_VALUES:
        return GridIssue("", f"the grid expands to more than {MAX_GRID_VALUES} values once its YAML aliases are "
                             f"followed (*name repeats what &name holds); at most {MAX_GRID_VALUES} are accepted")
    return None


def _multi_question(task: str) -> bool:
    from kdeval.evals import get_spec  # the tasks (torch): when a grid is counted, not for `--help`

    try:
        return bool(get_spec(task).cls.multi_question)
    except Exception:  # an unknown task: reported by the registry checks
        return False


def cell_count(grid: GridSpec) -> int:
    """The number of cells :func:`kdeval.jobs.grid.cells.expand_grid` enumerates for ``grid`` (before cells that
    come out identical are merged): computed from the list lengths, without building one."""
    conversations = len(grid.conversations)
    instances = sum(len(t.lengths or [None]) * len(t.seeds) * (conversations if _multi_question(t.name) else 1)
                    for t in grid.tasks)
    per_store = sum(1 if p.name in BUDGET_FREE_POLICIES else len(grid.budgets) * len(grid.protocols)
                    for p in grid.policies)
    return len(grid.models) * len(grid.chunk_sizes) * instances * per_store * len(grid.kv_quant)


def cells_issue(grid: GridSpec) -> GridIssue | None:
    """The issue of a grid of more than :data:`MAX_GRID_CELLS` cells, naming its count and the lists that make it."""
    n = cell_count(grid)
    if n <= MAX_GRID_CELLS:
        return None
    return GridIssue("", f"the grid expands to {n} cells (models × chunk_sizes × tasks' lengths and seeds × policies "
                         f"× budgets × protocols × kv_quant); at most {MAX_GRID_CELLS} are accepted: split it")
