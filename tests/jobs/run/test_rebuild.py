"""An index lost is rebuilt from the results directory (`kdeval index rebuild`), and a submit with a fresh
index into a results directory that holds a cell's files adopts them: nothing computed, nothing rewritten."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import RunIndex, part_files, read_cell_rows, write_cell_rows

from tests.support.helpers import stub_grid

runner = CliRunner()

#: 5 cells of 3 samples in shards of 2: every cell is 2 parts.
GRID = stub_grid(cost=0.01, workers=2).replace("resources: {workers: 2}", "resources: {workers: 2, shard_size: 2}")


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the CLI's consoles are made per call and read it


def _files(results: Path) -> dict[str, tuple[str, int]]:
    """Every cell file: its hash and modification time."""
    return {str(p.relative_to(results)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted((results / "cells").rglob("*")) if p.is_file()}


def _report(db: Path) -> tuple[dict, str]:
    """The newest run's report as JSON (without the time it was made) and as the terminal prints it."""
    js = runner.invoke(kdeval_app, ["report", "--db", str(db), "--format", "json", "--resamples", "100"])
    table = runner.invoke(kdeval_app, ["report", "--db", str(db), "--resamples", "100"])
    assert js.exit_code == 0 and table.exit_code == 0, js.output + table.output
    data = json.loads(js.stdout)
    data["meta"].pop("created")
    return data, table.output


def _drop_index(db: Path) -> None:
    for p in db.parent.glob(db.name + "*"):
        p.unlink()


@pytest.fixture
def ran(local_ray, app, paths, wide):
    """A finished run of :data:`GRID`: (paths, run id, its report)."""
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(GRID)
    r = runner.invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 0, r.output
    run_id = RunIndex.open(paths["db"]).list_runs()[0].id
    return paths, run_id, _report(paths["db"])


def test_a_lost_index_is_rebuilt_and_reports_the_same(ran):
    paths, run_id, before = ran
    res = paths["results"]
    for d in (res / "cells").glob("*/*"):  # every part rewritten as `kdeval rescore` rewrites them
        write_cell_rows(res, d.name, read_cell_rows(res, str(d.relative_to(res))))
    files = _files(paths["results"])
    assert sum(len(part_files(d)) for d in (paths["results"] / "cells").glob("*/*")) == 10
    _drop_index(paths["db"])
    r = runner.invoke(kdeval_app, ["index", "rebuild", "--results-dir", str(paths["results"]),
                                   "--db", str(paths["db"])])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("rebuilt 1 run(s) with 5 done cell(s)")
    assert _report(paths["db"]) == before
    idx = RunIndex.open(paths["db"])
    run = idx.get_run(run_id)
    assert (run.name, run.state, run.counts) == ("stub-grid", "done", {"done": 5})
    assert "attempt history not recovered" in run.message
    assert idx.run_attempts(run_id) == []  # marked, not invented
    assert all(c.summary and c.summary["n"] == 3 and c.n_rows == 3 for c in idx.run_cells(run_id))
    assert _files(paths["results"]) == files  # rebuilding reads only
    again = runner.invoke(kdeval_app, ["index", "rebuild", "--results-dir", str(paths["results"]),
                                       "--db", str(paths["db"])])
    assert again.exit_code == 0 and "1 run(s) already in the index left as they were" in again.output


def test_a_resubmit_with_a_fresh_index_adopts_every_cell_and_rewrites_nothing(ran, app):
    paths, run_id, before = ran
    files = _files(paths["results"])
    fresh = paths["tmp"] / "fresh.sqlite"
    r = runner.invoke(app, ["submit", str(paths["tmp"] / "g.yaml"), "--db", str(fresh),
                            "--results-dir", str(paths["results"])])
    assert r.exit_code == 0, r.output
    assert "5 cell(s) adopted" in r.output and "5 cells, 5 already done, 0 to run" in r.output
    idx = RunIndex.open(fresh)
    new_run = idx.list_runs()[0].id
    assert idx.run_attempts(new_run) == []  # nothing computed
    assert _files(paths["results"]) == files  # nothing rewritten
    data, table = _report(fresh)
    # the report's last line names the index it read (where that index's leaderboard is): the fresh one here
    table = table.replace(str(fresh), str(paths["db"]))
    assert (data, table) == (json.loads(json.dumps(before[0]).replace(run_id, new_run)),
                             before[1].replace(run_id, new_run))


def test_parts_that_do_not_make_their_cell_are_named_and_left_to_compute(ran, app):
    paths, run_id, _ = ran
    cells = sorted((paths["results"] / "cells").glob("*/*"))
    cut = part_files(cells[0])[1]
    cut.write_bytes(cut.read_bytes()[:300])                  # a part cut short (a copy interrupted)
    part_files(cells[1])[0].unlink()                         # a lost part
    (paths["results"] / "runs" / f"{run_id}.json").unlink()  # and the run's manifest
    _drop_index(paths["db"])
    r = runner.invoke(kdeval_app, ["index", "rebuild", "--results-dir", str(paths["results"]),
                                   "--db", str(paths["db"])])
    assert r.exit_code == 1, r.output
    assert (f"not recovered: {cells[0].name}: part-0001.parquet: truncated or corrupt (not a readable Parquet "
            "file: ") in r.output, r.output
    assert "older kdeval" not in r.output
    assert f"not recovered: {cells[1].name}: parts of shards [1] are not the 2 shards of 3 samples" in r.output
    run = RunIndex.open(paths["db"]).get_run(run_id)
    # without its manifest the run is made of the cells its rows name; its grid is unknown
    assert (run.name, run.state, run.counts) == ("rebuilt", "done", {"done": 3})
    assert "its grid is unknown" in run.message


def test_recovery_reads_each_part_once_and_checks_the_rows_it_read(ran, monkeypatch):
    import pyarrow.parquet as pq

    from kdeval.jobs.run.recovery import Recovered, recover_cell
    from kdeval.storage import read_part_metadata

    paths, _, _ = ran
    res = paths["results"]
    cells = sorted((res / "cells").glob("*/*"))
    opened: list[str] = []
    for name in ("ParquetFile", "read_table", "read_schema", "read_metadata"):
        real = getattr(pq, name)
        monkeypatch.setattr(pq, name, lambda *a, _real=real, _name=name, **k: opened.append(_name) or _real(*a, **k))
    got = recover_cell(res, cells[0].name)
    assert isinstance(got, Recovered) and opened == ["ParquetFile", "ParquetFile"]  # two parts, one open each
    monkeypatch.undo()
    assert got.rows == read_cell_rows(res, str(cells[0].relative_to(res)))
    assert got.held.n_rows() == 3 and len(got.held.done) == 2
    # a part whose description is its cell's but whose rows are another cell's, or no cell's
    part = part_files(cells[1])[1]
    table = pq.read_table(part)
    ids = table.column_names.index("cell_id")
    for value, why in ((cells[2].name, f"holds cell {cells[2].name}"),
                       (None, "holds rows of no cell (1 null cell_id)")):
        forged = table.set_column(ids, "cell_id", pa.array([value] * table.num_rows, pa.string()))
        pq.write_table(forged.replace_schema_metadata(read_part_metadata(part)), part)
        assert recover_cell(res, cells[1].name) == f"part-0001.parquet: {why}"
    # rows that cannot be read under a readable description: named as the integrity check names them
    pq.write_table(table.drop(["cell_id"]).replace_schema_metadata(read_part_metadata(part)), part)
    assert recover_cell(res, cells[1].name) == \
        "part-0001.parquet: no cell_id column (written before rows named their cell)"


class _Killed(BaseException):
    """A rebuild stopped between two cells, as a SIGKILL stops it (each cell is its own transaction)."""


def _killed_rebuild(paths, monkeypatch, after: int) -> None:
    from kdeval.jobs.run import recovery, service
    from kdeval.jobs.run.recovery import rebuild_index

    real, calls = recovery._finish, []

    def dying(*args, **kwargs):
        if len(calls) == after:
            raise _Killed
        calls.append(1)
        return real(*args, **kwargs)

    _drop_index(paths["db"])
    monkeypatch.setattr(recovery, "_finish", dying)
    with pytest.raises(_Killed):
        rebuild_index(RunIndex.open(paths["db"]), paths["results"], service.default_workload)
    monkeypatch.setattr(recovery, "_finish", real)


def test_a_rebuild_killed_midway_is_finished_by_the_next_and_resume_adopts_its_files(ran, app, monkeypatch):
    paths, run_id, before = ran
    files = _files(paths["results"])
    _killed_rebuild(paths, monkeypatch, after=2)
    run = RunIndex.open(paths["db"]).get_run(run_id)
    assert (run.state, run.counts) == ("pending", {"done": 2, "pending": 3})
    r = runner.invoke(kdeval_app, ["index", "rebuild", "--results-dir", str(paths["results"]),
                                   "--db", str(paths["db"])])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("rebuilt 1 run(s) with 5 done cell(s)"), r.output
    run = RunIndex.open(paths["db"]).get_run(run_id)
    assert (run.state, run.counts) == ("done", {"done": 5}) and "attempt history not recovered" in run.message
    assert _report(paths["db"]) == before
    # killed again, then resumed: the cells whose files check out are adopted, none recomputed
    _killed_rebuild(paths, monkeypatch, after=1)
    r = runner.invoke(app, ["resume", run_id, "--db", str(paths["db"])])
    assert r.exit_code == 0, r.output
    run = RunIndex.open(paths["db"]).get_run(run_id)
    assert (run.state, run.counts) == ("done", {"done": 5})
    assert _files(paths["results"]) == files  # nothing rewritten
