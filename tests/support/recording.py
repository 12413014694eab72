"""A stub workload that writes down every group call a worker makes (in a worker process: to a file)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kdeval.cluster.stub import StubWorkload


@dataclass(frozen=True)
class RecordingStub(StubWorkload):
    """:class:`StubWorkload` that appends one JSON line per ``run_group`` call to ``log``: the cells (id,
    sample range, task label) in the call."""

    log: str = ""

    def run_group(self, handle, tasks, on_samples=None, on_result=None):
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps([[t.cell_id, t.sample_start, t.sample_stop, f"{t.task}@{t.length}#s{t.seed}"]
                                for t in tasks]) + "\n")
        return super().run_group(handle, tasks, on_samples, on_result)


def group_calls(log: Path) -> list[list[list]]:
    """The ``run_group`` calls :class:`RecordingStub` recorded, in order ([] when none)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
