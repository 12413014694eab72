"""What a group holds beside its cells: the bytes of its shared stores' recorded steps (keys, values, logits, the
captured attention rows, queries and hidden states every member policy reads), at their peak, against one
prompt's full cache.

Runs ``evals.run.group_run.run_group`` in this process over bench/shared_grid.py's cells (``leaderboard``: one-shot,
both protocols, three shares; ``paper``: chunked at N = L/8, L/4, L/2 with B = L/16, the 2K grid's fork points),
batch size unset as ``kdeval submit`` leaves it on a CPU, and watches every ``SharedSteps`` alive at once after
each record it keeps. Not counted: while a window's trunks are recorded as one batch (kdeval/keydiff/batch/trunk.py),
its batch cache holds their keys and values a second time.

    KDEVAL_DATA_DIR=../shared/data python bench/group_memory.py --grid leaderboard --length 1024 --samples 2
    KDEVAL_DATA_DIR=../shared/data python bench/group_memory.py --grid paper --length 1024 --samples 9
"""
from __future__ import annotations

import argparse
import dataclasses
import weakref

from chunked_profile import paper_cells
from shared_grid import grid, members
from shared_profile import needle_group


def record_bytes(record) -> dict[str, int]:
    """Bytes of one recorded step by part."""
    parts = {"keys and values": sum(t.nbytes for t in (*record.keys, *record.values)), "logits": record.logits.nbytes,
             "attention rows": sum(r.nbytes for rows in record.attention.values() for r in rows.values())}
    for name in ("queries", "hidden_states"):
        held = getattr(record, name)
        parts[name.replace("_", " ")] = sum(t.nbytes for t in held.values()) if held else 0
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=["leaderboard", "paper"], default="leaderboard")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--new", type=int, default=4)
    args = ap.parse_args()

    from kdeval.evals.task_run import group_run
    from kdeval.keydiff.step.shared import SharedSteps

    lm, task, prompts = needle_group(args.length, args.samples, args.new)
    if args.grid == "paper":
        cells = paper_cells(args.length, args.new, args.samples)
    else:
        cells = members(grid("leaderboard", args.length, args.samples, args.new, True))

    live: weakref.WeakSet = weakref.WeakSet()
    peak = {"total": 0, "stores": 0, "parts": {}}
    made, kept = SharedSteps.__init__, SharedSteps.keep

    def init(self, *a, **k):
        made(self, *a, **k)
        live.add(self)

    def keep(self, *a, **k):  # every record lands here: a batch-1 step's and a batch-recorded trunk's rows
        kept(self, *a, **k)
        parts: dict[str, int] = {}
        for s in live:
            for rec in s.records.values():
                for name, n in record_bytes(rec).items():
                    parts[name] = parts.get(name, 0) + n
        total = sum(parts.values())
        if total > peak["total"]:
            peak.update(total=total, stores=sum(1 for s in live if s.records), parts=parts)

    SharedSteps.__init__, SharedSteps.keep = init, keep
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=None) for c in cells], prompts, batch_size=8)

    cfg = lm.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    lengths = [len(p.ids) for p in prompts[1]]
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # keys and values, float32
    mib = lambda n: n / 2**20  # noqa: E731
    print(f"{args.grid} grid: {len(cells)} cells x {args.samples} samples of {min(lengths)}-{max(lengths)} tokens")
    print(f"one prompt's full cache ({max(lengths)} tokens): {mib(per_token * max(lengths)):.2f} MiB")
    print(f"the stores' peak: {mib(peak['total']):.2f} MiB in {peak['stores']} store(s) with records")
    for name, n in peak["parts"].items():
        print(f"  {name}: {mib(n):.2f} MiB")


if __name__ == "__main__":
    main()
