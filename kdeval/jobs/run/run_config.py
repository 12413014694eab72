"""What a scheduler run is told (:class:`SchedulerConfig`) and what it did (:class:`RunOutcome`); no Ray here, so
the service reads and builds them without importing the scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field

from kdeval.cluster.raysetup import WorkerResources

__all__ = ["RunOutcome", "SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    """How many workers, what each holds, how work is split, and the reliability knobs."""

    workers: int = 1
    resources: WorkerResources = WorkerResources()
    max_attempts: int = 3  # per shard
    cell_timeout_s: float | None = None  # per attempt, i.e. per shard
    poll_s: float = 0.25
    heartbeat_s: float = 1.0
    worker_start_timeout_s: float = 300.0
    shard_size: int = 32  # samples per unit of work (a cell's plan keeps the size it was started with)
    wait_for_held: bool = True  # cells another live driver holds: wait for them (False: leave them)
    share: bool = True  # run the cells that can share as groups (kdeval.jobs.run.groups); False: every cell alone
    #: a group's fresh cells are planned in shards of at most this many samples, each stored as soon as the
    #: group finishes it (the group still runs its whole range, up to its shard size, in one call)
    stream_size: int = 4
    time_first: bool = True  # a group runs each cell's first samples alone, timed (False: accuracy only)

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"shard_size: expected a number of samples >= 1, got {self.shard_size}")
        if self.stream_size < 1:
            raise ValueError(f"stream_size: expected a number of samples >= 1, got {self.stream_size}")


@dataclass
class RunOutcome:
    """What a scheduler run did."""

    done: int
    failed: int
    left: int  # cells neither done nor failed (cancelled, held by another driver, or no worker could start)
    attempts: int  # attempts at shards in this session
    model_loads: int
    workers_lost: int
    cancelled: bool
    message: str | None = None
    model_loads_by_worker: dict[str, int] = field(default_factory=dict)
