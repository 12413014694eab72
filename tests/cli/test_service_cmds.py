"""The service commands through Typer: submit / status / ls / cancel / resume, exit codes, bad input."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdeval.cli import detach
from kdeval.storage import RunIndex

from tests.jobs.grid.test_grid import BASE
from tests.support.helpers import stub_grid

runner = CliRunner()


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_submit_status_ls_and_exit_codes(local_ray, app, paths):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid())
    db, res = str(paths["db"]), str(paths["results"])

    dry = runner.invoke(app, ["submit", str(grid), "--db", db, "--results-dir", res, "--dry-run"])
    assert dry.exit_code == 0 and "5 cells, 0 already done, 5 to run" in dry.output
    assert not paths["db"].exists()  # a dry run writes nothing

    r = runner.invoke(app, ["submit", str(grid), "--db", db, "--results-dir", res])
    assert r.exit_code == 0, r.output
    run_id = RunIndex.open(db).list_runs()[0].id
    assert f"run {run_id}" in r.output

    dry = runner.invoke(app, ["submit", str(grid), "--db", db, "--dry-run"])
    assert "5 already done, 0 to run" in dry.output

    st = runner.invoke(app, ["status", run_id[:12], "--db", db, "--json"])
    data = json.loads(st.output)
    assert data["run"]["state"] == "done" and data["run"]["counts"] == {"done": 5}
    assert len(data["cells"]) == 5 and all(c["worker"] for c in data["cells"])
    assert runner.invoke(app, ["ls", "--db", db]).exit_code == 0
    assert runner.invoke(app, ["status", "--db", db]).exit_code == 0
    assert runner.invoke(app, ["status", run_id, "--db", db, "--watch"]).exit_code == 0  # ends: run is done
    assert runner.invoke(app, ["status", "nope", "--db", db]).exit_code == 2
    assert runner.invoke(app, ["cancel", run_id, "--db", db]).output.startswith(f"run {run_id} already done")

    # some cells failed -> exit code 1 (here: a stub cost beyond the grid's cell timeout)
    slow = paths["tmp"] / "slow.yaml"
    slow.write_text(stub_grid(cost=5).replace("policies: [full, keydiff, keydiff-mean]", "policies: [full]")
                    .replace("retries: {max_attempts: 3}", "retries: {max_attempts: 1, cell_timeout_s: 0.3}"))
    r = runner.invoke(app, ["submit", str(slow), "--db", db, "--results-dir", res])
    assert r.exit_code == 1, r.output
    st = json.loads(runner.invoke(app, ["status", RunIndex.open(db).list_runs()[0].id, "--db", db, "--json"]).output)
    assert st["run"]["state"] == "failed"
    assert "cell exceeded cell_timeout_s=0.3" in st["cells"][0]["error_line"]


BAD_GRIDS = {
    "yaml": ("models: [", "not valid YAML"),
    "typo-field": (BASE.replace("budgets:", "budgts:"), "budgts: unknown field (did you mean 'budgets'?)"),
    "typo-policy": (BASE.replace("[full, keydiff,", "[full, keydif,"), "did you mean 'keydiff'?"),
    "bad-param": (BASE.replace("window_fraction: 0.5", "window_fraction: -1"), "policies[2].params.window_fraction: must be in [0, 1)"),
    "remote-code": (BASE.replace("dtype: bfloat16", "trust_remote_code: true"), "trust_remote_code: is not accepted"),
    "empty": ("", "expected a mapping at the top level"),
    # the engine's test hooks (Engine(cache_layer=..., graph_runner=...)) are not grid options
    "engine-hook": (BASE + "engine: {graph_runner: eager}\n", "engine.graph_runner: unknown field"),
    "engine-store": (BASE + "engine: {store: gather}\n", "engine.store: unknown field"),
    "engine-emulate": (BASE + "engine: {emulate_graphs: true}\n", "engine.emulate_graphs: unknown field"),
}


@pytest.mark.parametrize("name", sorted(BAD_GRIDS))
def test_malformed_grid_exit_2_and_database_untouched(app, paths, name):
    text, expected = BAD_GRIDS[name]
    idx = RunIndex.open(paths["db"])
    idx.list_runs()
    idx.close()
    before = _snapshot(paths["tmp"])
    grid = paths["tmp"] / "bad.yaml"
    grid.write_text(text)
    before_with_grid = dict(before, **{"bad.yaml": hashlib.sha256(grid.read_bytes()).hexdigest()})
    r = runner.invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 2
    assert expected in r.output, r.output
    assert _snapshot(paths["tmp"]) == before_with_grid
    assert not paths["results"].exists()


def test_missing_grid_file_is_bad_input(app, paths):
    r = runner.invoke(app, ["submit", str(paths["tmp"] / "nope.yaml"), "--db", str(paths["db"])])
    assert r.exit_code == 2 and "cannot read grid file" in r.output
    assert not paths["db"].exists()


def test_resume_refuses_while_a_live_driver_runs_the_run(app, paths):
    import socket
    import subprocess

    from kdeval.jobs.run import service
    from kdeval.jobs.grid.load import parse_grid

    idx = RunIndex.open(paths["db"])
    run_id, _ = service.create_run(idx, parse_grid(stub_grid()), stub_grid(), paths["results"])
    other = subprocess.Popen(["sleep", "60"])  # stands in for a live driver process
    try:
        idx.start_driver(run_id, socket.gethostname(), other.pid)
        assert service.driver_alive(idx.get_run(run_id))
        # --no-wait refuses (by default resume waits for the live driver: tests/jobs/run/test_leases.py)
        r = runner.invoke(app, ["resume", run_id, "--db", str(paths["db"]), "--no-wait"])
        assert r.exit_code == 2 and f"still being run by pid {other.pid}" in r.output
        with pytest.raises(service.RunBusyError):
            service.execute_run(idx, run_id, wait=False)
    finally:
        other.kill()
        other.wait(timeout=10)
    assert not service.driver_alive(idx.get_run(run_id))  # a dead pid no longer blocks resume
    st = runner.invoke(app, ["status", run_id, "--db", str(paths["db"])], env={"COLUMNS": "200"})
    assert f"kdeval resume {run_id}" in st.output


def test_read_commands_never_create_an_index(app, paths):
    for args in (["ls"], ["status"], ["status", "x", "--json"], ["cancel", "x"], ["resume", "x"], ["rescore", "x"]):
        r = runner.invoke(app, args + ["--db", str(paths["db"])])
        assert r.exit_code == 2 and "no index at" in r.output, (args, r.output)
    assert not paths["db"].exists()


def test_ray_job_spec_ships_the_grid_and_runs_submit_on_the_head(paths):
    grid = paths["tmp"] / "my grid.yaml"
    grid.write_text(stub_grid())
    entry, env = detach.ray_job_spec(grid, None, None)
    assert entry == "kdeval submit grid.yaml --db '~/.kdeval/index.sqlite' --results-dir '~/.kdeval/results' --address auto"
    staged = Path(env["working_dir"]) / "grid.yaml"
    assert staged.read_text() == grid.read_text()
    import shutil
    shutil.rmtree(env["working_dir"])
    url = "postgresql+psycopg://kd:Pa55word@db/kdeval"
    entry, env = detach.ray_job_spec(grid, url, Path("/data/res"))
    assert "--db @index-url --results-dir /data/res" in entry and "Pa55word" not in entry
    url_file = Path(env["working_dir"]) / "index-url"
    assert url_file.read_text() == url + "\n" and url_file.stat().st_mode & 0o777 == 0o600
    assert "Pa55word" not in json.dumps(env)
    shutil.rmtree(env["working_dir"])


def test_status_at_80_columns_keeps_run_ids_and_numbers_whole(store):
    """A user's 80-column terminal: the runs table shows a run id on one line (it is what they type next); a
    cell shows its task's headline metric, its name folding away from its value but never a number cut (rich
    cropped the table's right edge when a long policy label and task met: ``score 10`` for 100.00); the length
    and seed every task shares are said once, in the heading. A wide terminal shows every metric."""
    import subprocess
    import sys

    from tests.jobs.reports.helpers import FakeCell, rows, store_run
    from tests.user_env import user_env

    idx, res = store
    run_id = "20261202-091030-dc4afc"
    summary = {"score": 100.0, "contains": 0.0, "rouge_l_recall": 52.5, "shared_rows": 3}
    store_run(idx, res, run_id, [
        FakeCell("full", None, rows=rows([1.0] * 3), summary=summary),
        FakeCell("keydiff", "25%", rows=rows([1.0] * 3), summary=summary),
        FakeCell("snapkv", 128, params={"window": 32}, task="ruler.niah_single_1", rows=rows([1.0] * 3),
                 summary=summary)], name="my-shared-check")
    db = str(res.parent / "index.sqlite")  # the store fixture's index
    idx.close()

    def status(*args: str, columns: int = 80) -> list[str]:
        r = subprocess.run([sys.executable, "-m", "kdeval.cli.app", "status", *args, "--db", db],
                           capture_output=True, text=True, env=user_env(COLUMNS=str(columns)), timeout=120)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert max(len(ln) for ln in lines) <= columns, r.stdout
        return lines

    runs = status()
    assert any(run_id in ln and "my-shared-check" in ln for ln in runs), "\n".join(runs)
    cells = status(run_id)
    text = "\n".join(cells)
    assert "every task: 1024 tokens, seed 0" in text and "#s0" not in text and "@1024" not in text, text
    assert sum("done shared" in ln for ln in cells) == 3, text
    # each cell on one line: its headline value in the column, the metric named once under the table
    assert sum("done shared" in ln and ln.rstrip().endswith(" 100.00") for ln in cells) == 3, text
    assert "score: score" in cells, text
    assert "snapkv(window=32)" in text and "contains" not in text, text  # the headline only
    for columns in (110, 160):  # wide enough for every metric, each whole on a line
        wide = "\n".join(status(run_id, columns=columns))
        assert wide.count("contains=0.00") == 3 and wide.count("rouge_l_recall=52.50") == 3, wide
