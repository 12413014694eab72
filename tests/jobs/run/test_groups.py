"""Shared execution with the stub workload on a local Ray: the cells of one task run as one group call per
shard, each cell keeps its own attempts, rows and summary; ``execution: {share: false}`` runs them one by one;
a worker lost mid-group, or a group that fails as a whole, has its shards rerun alone."""
from __future__ import annotations

from collections import Counter

from typer.testing import CliRunner

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service
from kdeval.jobs.run.groups import execution_label
from tests.support.helpers import stub_grid
from tests.support.helpers import assert_results_consistent, attempt_states, new_run

from tests.support.recording import RecordingStub, group_calls


def _grid(workers: int = 1, shard_size: int = 32, share: bool | None = None) -> str:
    """The 5-cell stub grid (full + keydiff and keydiff-mean at 2 budgets, one needle task of 3 samples)."""
    text = stub_grid(cost=0.01, workers=workers).replace(f"resources: {{workers: {workers}}}",
                                                         f"resources: {{workers: {workers}, shard_size: {shard_size}}}")
    return text + ("" if share is None else f"execution: {{share: {str(share).lower()}}}\n")


def _rows(idx, cell_id: str) -> list[dict]:
    return idx.read_cell_table(cell_id).drop_columns(["run_id"]).to_pylist()


def test_cells_of_one_task_run_as_one_group_call_per_shard(local_ray, paths, app):
    log = paths["tmp"] / "groups.jsonl"
    idx, run_id, plan = new_run(paths["db"], paths["results"], _grid(shard_size=2))
    out = service.execute_run(idx, run_id, workload=RecordingStub(log=str(log)))
    assert (out.done, out.failed, out.attempts) == (5, 0, 10)  # 5 cells x 2 shards: one attempt per shard
    calls = group_calls(log)
    ids = {c.id for c in plan.cells}
    assert len(calls) == 2  # one call per shard range, all five cells in it
    assert [{tuple(m[1:3]) for m in call} for call in calls] == [{(0, 2)}, {(2, 3)}]
    assert all({m[0] for m in call} == ids and len(call) == 5 for call in calls)
    assert attempt_states(idx, run_id) == {"done": 10}
    for cell in idx.run_cells(run_id):
        assert [(s.start, s.stop, s.n_rows) for s in idx.cell_shards(cell.id)] == [(0, 2, 2), (2, 3, 1)]
        assert sorted(a.shard for a in idx.cell_attempts(cell.id)) == [0, 1]
        rows = idx.read_cell_table(cell.id).to_pylist()
        assert [r["cell_id"] for r in rows] == [cell.id] * 3 and [r["execution"] for r in rows] == ["shared"] * 3
        assert cell.summary["shared_rows"] == 3 and execution_label(cell.summary, cell.n_rows) == "shared"
        assert cell.duration_s is not None and cell.duration_s < 5  # its own seconds, not the group's sum
    st = CliRunner().invoke(app, ["status", run_id, "--db", str(paths["db"])], env={"COLUMNS": "200"})
    assert st.exit_code == 0 and st.output.count("done shared") == 5, st.output
    assert "shared_rows" not in st.output  # a count, not a headline score
    narrow = CliRunner().invoke(app, ["status", run_id, "--db", str(paths["db"])], env={"COLUMNS": "80"})
    lines = narrow.output.splitlines()
    assert narrow.exit_code == 0 and max(map(len, lines)) <= 80, narrow.output
    # a heading too wide for 80 columns puts its counts on their own line, whole
    assert narrow.output.count("done shared") == 5 and "pending 0  running 0  done 5  failed 0" in lines, lines


def test_share_false_runs_each_cell_alone_with_the_same_rows(local_ray, paths):
    log = paths["tmp"] / "groups.jsonl"
    idx, run_id, plan = new_run(paths["db"], paths["results"], _grid(share=False))
    out = service.execute_run(idx, run_id, workload=RecordingStub(log=str(log)))
    assert (out.done, out.attempts) == (5, 5) and group_calls(log) == []
    shared_dir = paths["tmp"] / "shared"
    idx1, run1, plan1 = new_run(shared_dir / "index.sqlite", shared_dir / "results", _grid())
    assert [c.id for c in plan1.cells] == [c.id for c in plan.cells]  # execution is not part of a cell's id
    assert service.execute_run(idx1, run1, workload=RecordingStub(log=str(log))).attempts == 5
    assert len(group_calls(log)) == 1
    for cell in idx.run_cells(run_id):
        alone, shared = _rows(idx, cell.id), _rows(idx1, cell.id)
        assert {r["execution"] for r in alone} == {"alone"} and {r["execution"] for r in shared} == {"shared"}
        assert [dict(r, execution=None) for r in alone] == [dict(r, execution=None) for r in shared]
        assert cell.summary["shared_rows"] == 0 and execution_label(cell.summary, cell.n_rows) == ""


def test_a_worker_killed_mid_group_requeues_every_shard_and_each_cell_is_done_once(local_ray, paths, app):
    # one worker, replaced when killed: the group is all five cells (two workers would split it over them)
    idx, run_id, _ = new_run(paths["db"], paths["results"], _grid(workers=1))
    # full and keydiff cells kill their worker on their first attempt: the group dies with its first member, full
    # (a member finished before the crash would be stored as the group streams it: tests/jobs/run/test_group_stream.py)
    out = service.execute_run(idx, run_id, workload=StubWorkload(crash_policies=("full", "keydiff"),
                                                                 crash_marker_dir=str(paths["tmp"])))
    assert (out.done, out.failed, out.left) == (5, 0, 0)
    # the group: 5 shards lost; alone, each keydiff cell crashes once more, then every cell is done
    assert attempt_states(idx, run_id) == {"lost": 7, "done": 5} and out.workers_lost == 3
    assert_results_consistent(idx, run_id, paths["results"], samples=3)
    lost = [a for a in idx.run_attempts(run_id) if a.state == "lost"]
    assert sum("in a group of 5 cells" in (a.error or "") for a in lost) == 5
    attempts = Counter(c.policy for c in idx.run_cells(run_id) for _ in range(c.n_attempts))
    assert attempts == {"full": 2, "keydiff-mean": 4, "keydiff": 6}  # 2 each; the keydiff cells 3
    for cell in idx.run_cells(run_id):
        assert execution_label(cell.summary, cell.n_rows) == ""  # rerun alone
    assert "done shared" not in CliRunner().invoke(app, ["status", run_id, "--db", str(paths["db"])]).output


def test_a_group_that_fails_as_a_whole_reruns_its_cells_alone(local_ray, paths):
    idx, run_id, _ = new_run(paths["db"], paths["results"], _grid())
    out = service.execute_run(idx, run_id, workload=StubWorkload(fail_policies=("keydiff-mean",),
                                                                 oom_policies=("keydiff",)))
    assert (out.done, out.failed, out.left) == (1, 4, 0)  # only each cell's own error fails it
    for cell in idx.run_cells(run_id):
        states = [a.state for a in sorted(idx.cell_attempts(cell.id), key=lambda a: a.id)]
        assert states == ["failed", "done" if cell.policy == "full" else "failed"]
        if cell.policy == "keydiff-mean":
            assert "stub failure injected for policy 'keydiff-mean'" in cell.error_line
        elif cell.policy == "keydiff":
            assert "out of memory" in cell.error_line
    first = min(idx.run_attempts(run_id), key=lambda a: a.id)
    assert "the group of 5 cells it ran in failed; it runs alone next" in first.error
