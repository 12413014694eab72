"""A results directory that becomes unwritable mid-run (read-only file system, permission denied) is a fault no
further attempt can pass: the run stops at the first write that fails, one line naming ``--results-dir`` and the
cause, exit 1, no shard attempted again; ``resume`` finishes it once the directory can be written. (A full disk
is still retried within the attempt cap.)"""
from __future__ import annotations

import errno
import functools

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import outcomes, service
from kdeval.storage import RunIndex
from tests.support.helpers import stub_grid

runner = CliRunner()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_an_unwritable_results_dir_stops_the_run_in_one_line_without_retries(local_ray, paths, monkeypatch, code):
    monkeypatch.setenv("COLUMNS", "400")  # the CLI's consoles are made per call and read it
    monkeypatch.setattr(service, "execute_run", functools.partial(service.execute_run, workload=StubWorkload(),
                                                                  num_cpus=2))
    real = outcomes.write_part
    writes: list[str] = []

    def unwritable(results_dir, cell_id, *a, **k):
        writes.append(cell_id)
        raise OSError(code, "simulated")

    monkeypatch.setattr(outcomes, "write_part", unwritable)
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid(cost=0.01, workers=1))  # max_attempts: 3
    args = ["--db", str(paths["db"])]
    r = runner.invoke(kdeval_app, ["submit", str(grid), *args, "--results-dir", str(paths["results"])])
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    why = outcomes.UNWRITABLE[code]
    assert errors and errors[0].startswith(f"error: --results-dir: {paths['results'].resolve()} cannot be written: "
                                           f"{why}; run "), r.output
    assert "Traceback" not in r.output
    idx = RunIndex.open(paths["db"])
    [run] = idx.list_runs()
    assert run.state == "failed" and "--results-dir" in (run.message or "")
    per_cell = {c.id: idx.cell_attempts(c.id) for c in idx.run_cells(run.id)}
    assert len(writes) == 1  # the first write that failed stopped the run
    assert max(len(a) for a in per_cell.values()) == 1, per_cell  # no shard attempted again
    assert {a.state for a in sum(per_cell.values(), [])} <= {"failed", "lost"}  # none left running
    assert {c.state for c in idx.run_cells(run.id)} == {"pending"}  # given back, not failed
    idx.close()
    monkeypatch.setattr(outcomes, "write_part", real)
    r = runner.invoke(kdeval_app, ["resume", run.id, *args])
    assert r.exit_code == 0, r.output
