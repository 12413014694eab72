"""Scheduler benchmark with a stub workload of known cost (no models, no GPU).

Measures, on simulated Ray clusters (``ray.cluster_utils.Cluster``, loopback):

1. per-cell scheduling overhead: zero-cost cells on one worker, time per cell between the first and
   the last completion (start-up excluded): dispatch + ``ray.wait`` + Parquet write + index writes;
2. throughput with 1 vs 2 simulated nodes (one 1-CPU worker per node), cells of a known cost;
3. model loads: two models, two workers, many cells -> loads must be <= workers x models, not cells;
4. one large cell on 2 simulated nodes vs 1 (one 1-CPU worker per node): its samples split in shards,
   a stub cost per sample; samples/s between the first and the last stored shard, and wall time from the
   first shard started to the cell done.

    python bench/scheduler.py            # ~2 minutes; prints a Markdown table
    python bench/scheduler.py --out bench/out/scheduler.md
    python bench/scheduler.py --only large-cell   # case 4 alone
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from kdeval.cluster.stub import StubWorkload  # noqa: E402
from kdeval.jobs.grid.load import parse_grid  # noqa: E402
from kdeval.jobs.run import service  # noqa: E402
from kdeval.storage import RunIndex  # noqa: E402

GRID = """
name: bench
models: {models}
policies: [full, keydiff]
budgets: {budgets}
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 4}}]
resources: {{workers: {workers}}}
"""


LARGE_CELL = """
name: bench-large-cell
models: ["stub:0"]
policies: [keydiff]
budgets: [64]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: {samples}, params: {{depths: {depths}}}}}]
resources: {{workers: {workers}, shard_size: {shard_size}}}
"""


def large_cell_text(samples: int, workers: int, shard_size: int) -> str:
    """One cell of ``samples`` needle samples (one per depth) in shards of ``shard_size``."""
    depths = [round(100 * i / (samples - 1), 3) for i in range(samples)]
    return LARGE_CELL.format(samples=samples, depths=depths, workers=workers, shard_size=shard_size)


def grid_text(n_cells_per_model: int, workers: int, models: list[str]) -> str:
    """A grid with ``n_cells_per_model`` cells per model: 1 full + (n-1) keydiff budgets."""
    budgets = list(range(64, 64 + n_cells_per_model - 1))
    return GRID.format(models=models, budgets=budgets, workers=workers)


#: (seconds since start, cells done) at each completion of a run.
Timeline = list[tuple[float, int]]


def run_grid(text: str, workload: StubWorkload, tmp: Path, unit: str = "cells",
             starts: list | None = None) -> tuple[float, object, Timeline]:
    """Record and execute one grid in a fresh index; returns (seconds, RunOutcome, its timeline of cells or
    samples done). ``starts`` gets the time (since the start) the first shard started."""
    idx = RunIndex.open(tmp / f"{time.monotonic_ns()}.sqlite")
    run_id, _ = service.create_run(idx, parse_grid(text), text, tmp / "results")
    timeline: Timeline = []
    t0 = time.perf_counter()
    m0 = time.monotonic()

    def on_progress(p) -> None:
        n = p.done if unit == "cells" else p.samples_done
        if not timeline or timeline[-1][1] != n:
            timeline.append((time.perf_counter() - t0, n))
        if starts is not None and not starts and p.computing_since is not None:
            starts.append(p.computing_since - m0)

    out = service.execute_run(idx, run_id, workload=workload, on_progress=on_progress)
    wall = time.perf_counter() - t0
    assert out.failed == 0 and out.left == 0, out
    idx.close()
    return wall, out, timeline


def steady_throughput(timeline: Timeline) -> float:
    """Cells (or samples) per second between the first and the last completion (start-up excluded)."""
    done = [(t, n) for t, n in timeline if n > 0]
    (t1, n1), (t2, n2) = done[0], done[-1]
    return (n2 - n1) / (t2 - t1) if t2 > t1 else float("nan")


def with_cluster(n_nodes: int, fn):
    """Run ``fn()`` connected to a fresh simulated cluster of ``n_nodes`` 1-CPU nodes."""
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False))
    for _ in range(n_nodes):
        c.add_node(num_cpus=1)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        return fn()
    finally:
        ray.shutdown()
        c.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", type=float, default=0.25, help="seconds per cell for the throughput runs")
    ap.add_argument("--cells", type=int, default=24, help="cells for the throughput runs")
    ap.add_argument("--samples", type=int, default=128, help="samples of the large cell")
    ap.add_argument("--shard-size", type=int, default=8, help="shard size of the large cell")
    ap.add_argument("--sample-cost", type=float, default=0.1, help="seconds per sample of the large cell")
    ap.add_argument("--only", choices=["large-cell"], default=None, help="run one case only")
    ap.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kdeval-bench-"))
    lines = ["| measurement | value |", "|---|---|"]
    if args.only is None:
        cells_cases(args, tmp, lines)
    large_cell_case(args, tmp, lines)
    table = "\n".join(ln if ln.startswith("|") else f"| {ln} |" for ln in lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("## Scheduler (bench/scheduler.py)\n\n" + table + "\n")


def large_cell_case(args, tmp: Path, lines: list[str]) -> None:
    """Case 4: one cell in shards on 1 and on 2 simulated nodes."""
    n_shards = -(-args.samples // args.shard_size)
    thr, work = {}, {}
    for nodes in (1, 2):
        text = large_cell_text(args.samples, nodes, args.shard_size)
        starts: list = []
        wall, out, timeline = with_cluster(nodes, lambda: run_grid(
            text, StubWorkload(cost_per_sample_s=args.sample_cost), tmp, unit="samples", starts=starts))
        assert out.done == 1 and out.attempts == n_shards, out
        thr[nodes] = steady_throughput(timeline)
        work[nodes] = timeline[-1][0] - starts[0]
        lines.append(f"one cell of {args.samples} samples x {args.sample_cost:g} s in {n_shards} shards, "
                     f"{nodes} node(s) x 1 worker | {work[nodes]:.2f} s from the first shard started to the cell done ({wall:.2f} s "
                     f"wall incl. start-up); steady {thr[nodes]:.2f} samples/s (ideal {nodes / args.sample_cost:.2f})")
    lines.append(f"one large cell, 2 nodes / 1 node | {thr[2] / thr[1]:.2f}x steady samples/s, "
                 f"{work[1] / work[2]:.2f}x time from the first shard to done (ideal 2x)")


def cells_cases(args, tmp: Path, lines: list[str]) -> None:
    """Cases 1-3: per-cell overhead, throughput with 1 vs 2 nodes, model loads."""
    _, _, timeline = with_cluster(1, lambda: run_grid(grid_text(100, 1, ["stub:0"]), StubWorkload(cost_s=0.0), tmp))
    first_done = next(t for t, n in timeline if n > 0)
    lines.append(f"per-cell scheduling overhead (100 zero-cost cells, 1 worker, steady state) | "
                 f"{1000 / steady_throughput(timeline):.1f} ms")
    lines.append(f"run start-up until the first cell is done (Ray worker start, index) | {first_done:.2f} s")

    thr = {}
    for nodes in (1, 2):
        text = grid_text(args.cells, nodes, ["stub:0"])
        wall, _, timeline = with_cluster(nodes, lambda: run_grid(text, StubWorkload(cost_s=args.cost), tmp))
        thr[nodes] = steady_throughput(timeline)
        if nodes == 1:
            lines.append(f"per-cell overhead with {args.cost:g} s cells (1 / steady throughput - cost) | "
                         f"{(1 / thr[1] - args.cost) * 1000:.1f} ms")
        ideal = args.cells * args.cost / nodes
        lines.append(f"{nodes} node(s) x 1 worker, {args.cells} cells x {args.cost:g} s | "
                     f"{wall:.2f} s wall incl. start-up ({ideal:.2f} s of work per worker); steady "
                     f"{thr[nodes]:.2f} cells/s (ideal {nodes / args.cost:.2f})")
    lines.append(f"steady throughput 2 nodes / 1 node | {thr[2] / thr[1]:.2f}x (ideal 2x)")

    models = ["stub:0", "stub:0.0"]  # two distinct model ids
    text = grid_text(16, 2, models)
    _, out, _ = with_cluster(2, lambda: run_grid(text, StubWorkload(cost_s=0.05, load_cost_s=0.2), tmp))
    lines.append(f"model loads, 2 workers x 2 models, {out.attempts} cells | {out.model_loads} "
                 f"(bound 4; per worker {out.model_loads_by_worker})")


if __name__ == "__main__":
    main()
