"""Self-describing Parquet rows (the results directory reads alone) and ``kdeval export``."""
from __future__ import annotations

import csv
import hashlib
import json
import shutil
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from kdeval.cli import export_cmds
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.grid.cells import CellSpec, expand
from kdeval.jobs.grid.identity import cell_identity, self_describing
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.interop import export as export_job
from kdeval.jobs.run import service
from kdeval.storage import (
    IDENTITY_SCHEMA, RunIndex, list_result_files, read_cell_rows, with_identity, write_cell_rows,
)
from kdeval.version import source_hash

from tests.support.helpers import new_run, result_file

runner = CliRunner()

GRID = """
name: export-grid
models: [{id: "stub:0.01", dtype: bfloat16}]
policies: [full, {name: keydiff-sw, params: {window_fraction: 0.25}}, keydiff]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256, 512], samples: 2}]
protocol: {decode: keep}
resources: {workers: 2}
"""  # per length: full + 2 policies x 2 budgets = 10 cells, 20 rows
ROW_COLUMNS = ["id", "prompt_hash", "prompt_tokens", "truncated", "prediction", "references", "score"]


@pytest.fixture(scope="module")
def done_run(local_ray, tmp_path_factory):
    """One finished run of GRID: (index, run id, db path, results dir, tmp dir)."""
    tmp = tmp_path_factory.mktemp("export")
    db, res = tmp / "index.sqlite", tmp / "results"
    idx, run_id, plan = new_run(db, res, GRID)
    assert len(plan.cells) == 10
    assert service.execute_run(idx, run_id, workload=StubWorkload()).done == 10
    return idx, run_id, db, res, tmp


@pytest.fixture
def cli():
    a = typer.Typer()
    export_cmds.register(a)
    a.command("noop")(lambda: None)  # a second command keeps `export` a named subcommand
    return a


def test_stored_rows_carry_the_identity_of_their_cell(done_run):
    idx, run_id, _, res, _ = done_run
    for view in idx.run_cells(run_id):
        cell = CellSpec.model_validate(view.spec)
        table = pq.read_table(res / view.result_path)
        assert table.schema.names[:len(IDENTITY_SCHEMA)] == IDENTITY_SCHEMA.names
        assert table.schema.names[len(IDENTITY_SCHEMA):len(IDENTITY_SCHEMA) + len(ROW_COLUMNS)] == ROW_COLUMNS
        assert all(table.schema.field(f.name).type == f.type for f in IDENTITY_SCHEMA)  # budget int64 for full too
        ident = {n: set(table.column(n).to_pylist()) for n in IDENTITY_SCHEMA.names}
        assert ident == {
            "run_id": {run_id}, "cell_id": {view.id}, "model": {"stub:0.01"}, "policy": {view.policy},
            "params": {'{"window_fraction": 0.25}' if view.policy == "keydiff-sw" else "{}"},
            "budget": {view.budget}, "budget_share": {None}, "chunk_size": {32}, "task": {"needle"},
            "length": {cell.task.length},
            "seed": {0}, "dtype": {"bfloat16"}, "protocol": {"prompt/evict" if view.policy == "full" else "prompt/keep"},
        }
        assert view.n_rows == table.num_rows == 2


def test_done_cells_record_provenance(done_run):
    idx, run_id, *_ = done_run
    for view in idx.run_cells(run_id):
        p = view.provenance
        assert p["source_hash"] == source_hash() and p["host"] == socket.gethostname()
        assert (p["dtype"], p["attn_implementation"]) == ("bfloat16", "sdpa")
        assert p["torch"] is None and p["cuda"] is None and p["device"].startswith("cpu")  # stub cells: no torch


def test_results_directory_reads_alone_with_pyarrow_and_pandas(done_run):
    _, run_id, _, res, _ = done_run
    # a leftover temp file of a dead writer, with a clashing schema: readers skip '_'-prefixed files
    junk = res / "cells" / "zz" / "_tmp-zz-1.parquet"
    junk.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"policy": [1], "budget": ["x"]}), junk)
    try:
        t = ds.dataset(res / "cells", format="parquet").to_table(
            filter=(ds.field("policy") == "keydiff") & (ds.field("budget") == 64))
        assert t.num_rows == 4 and set(t.column("length").to_pylist()) == {256, 512}
        pd = pytest.importorskip("pandas")
        df = pd.read_parquet(res / "cells")
        assert len(df) == 20
        df = df[(df.policy == "keydiff-sw") & (df.budget == 128)]
        assert len(df) == 4 and set(df.params) == {'{"window_fraction": 0.25}'} and set(df.run_id) == {run_id}
        full = pd.read_parquet(res / "cells", filters=[("policy", "==", "full")])
        assert len(full) == 4 and full.budget.isna().all()
    finally:
        shutil.rmtree(junk.parent)


def test_cells_with_different_columns_read_as_one_dataset_with_unified_schemas(tmp_path):
    """The docs/reports.md snippet for results of several tasks: a column null in one cell and float in another,
    a metric column present in one task only."""
    cells = expand(parse_grid(GRID))
    a, b = cells[0], cells[1]
    root = tmp_path / "results" / "cells"
    root.mkdir(parents=True)
    pq.write_table(self_describing([{"id": "x", "depth": None}], a, "r"), root / "a.parquet")
    pq.write_table(self_describing([{"id": "y", "depth": 25.0, "rouge": 0.5}], b, "r"), root / "b.parquet")

    # --- the docs/reports.md snippet (imports: pathlib.Path, pyarrow as pa, pyarrow.dataset as ds, pyarrow.parquet as pq)
    files = [str(p) for p in Path(root).rglob("*.parquet") if not p.name.startswith("_")]
    schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    table = ds.dataset(files, schema=schema).to_table(filter=ds.field("policy") == b.policy)
    # ---
    assert table.to_pylist()[0]["depth"] == 25.0 and table.to_pylist()[0]["rouge"] == 0.5
    assert ds.dataset(files, schema=schema).to_table().num_rows == 2


def test_row_identity_keeps_the_rows_own_task_and_length():
    cell = expand(parse_grid(GRID))[1]
    ident = cell_identity(cell, "r9")
    assert ident["params"] == '{"window_fraction": 0.25}' and ident["length"] == 256
    t = with_identity([{"id": "a", "task": "ruler.vt", "length": 4096, "policy": "not-mine"},
                       {"id": "b", "task": None, "length": None}], ident)
    rows = t.to_pylist()
    assert [(r["task"], r["length"]) for r in rows] == [("ruler.vt", 4096), ("needle", 256)]
    assert rows[0]["policy"] == cell.policy  # identity columns are the cell's, not a row's own
    empty = self_describing([], cell, "r9")
    assert empty.num_rows == 0 and empty.schema == IDENTITY_SCHEMA
    with pytest.raises(ValueError, match="identity: missing seed"):
        with_identity([{"id": "a"}], {k: v for k, v in ident.items() if k != "seed"})


def test_rewriting_read_back_rows_keeps_identity_types(tmp_path):
    """``rescore`` rewrites a cell from its rows as dicts: a ``full`` cell's all-null budget stays int64."""
    full = expand(parse_grid(GRID))[0]
    assert full.budget is None
    rel = write_cell_rows(tmp_path, full.id, self_describing([{"id": "a"}, {"id": "b"}], full, "r1"))
    rows = read_cell_rows(tmp_path, rel)
    write_cell_rows(tmp_path, full.id, rows)
    schema = pq.read_schema(tmp_path / rel)
    assert all(schema.field(f.name).type == f.type for f in IDENTITY_SCHEMA)
    assert read_cell_rows(tmp_path, rel) == rows


def _all_rows(idx: RunIndex, run_id: str) -> list[dict]:
    return [r for v in idx.run_cells(run_id) for r in idx.read_cell_rows(v.id)]


def test_export_writes_every_sample_in_each_format(done_run, cli):
    idx, run_id, db, _, tmp = done_run
    expected = _all_rows(idx, run_id)
    assert len(expected) == 20

    out = tmp / "all.parquet"
    r = runner.invoke(cli, ["export", run_id[:12], "--format", "parquet", "--out", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert f"run {run_id}: 20 rows of 10 cells -> {out}" in r.output
    assert pq.read_table(out).to_pylist() == expected  # grid order, every column

    out = tmp / "all.jsonl"  # format from the suffix
    r = runner.invoke(cli, ["export", run_id, "--out", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected

    out = tmp / "all.csv"
    r = runner.invoke(cli, ["export", run_id, "--format", "csv", "--out", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    with out.open(newline="") as fh:
        got = list(csv.DictReader(fh))
    assert len(got) == 20 and list(got[0])[:len(IDENTITY_SCHEMA)] == IDENTITY_SCHEMA.names
    assert [json.loads(g["references"]) for g in got] == [e["references"] for e in expected]
    assert [(g["cell_id"], g["id"], g["prediction"]) for g in got] == [
        (e["cell_id"], e["id"], e["prediction"]) for e in expected]
    assert {g["budget"] for g in got if g["policy"] == "full"} == {""}
    assert not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


BAD = {
    "unknown-run": (["nope"], ["--format", "csv"], "out.csv", "error: RUN: no run 'nope' (or the prefix is ambiguous)"),
    "unknown-format": ([], ["--format", "xml"], "out.xml", "error: --format: expected one of parquet, csv, jsonl, kvpress, lm-eval, got 'xml'"),
    "no-format": ([], [], "out.txt", "error: --format: expected one of parquet, csv, jsonl, kvpress, lm-eval (the suffix of --out 'out.txt' names "
                  "none)"),
    "missing-dir": ([], ["--format", "csv"], "nodir/out.csv", "error: --out: directory {tmp}/nodir does not exist"),
    "file-as-dir": ([], ["--format", "csv"], "afile/out.csv", "error: --out: {tmp}/afile is not a directory"),
    "out-is-dir": ([], ["--format", "csv"], "adir", "error: --out: {tmp}/adir is a directory; expected a file path"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_export_bad_input_exits_2_and_writes_nothing(done_run, cli, tmp_path, case):
    _, run_id, db, _, _ = done_run
    run_args, opts, out_name, message = BAD[case]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    before = _snapshot(tmp_path)
    r = runner.invoke(cli, ["export", *(run_args or [run_id]), *opts, "--out", str(tmp_path / out_name),
                            "--db", str(db)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert message.format(tmp=tmp_path) in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_export_unwritable_directory_and_missing_index(done_run, cli, tmp_path, monkeypatch):
    _, run_id, db, _, _ = done_run
    r = runner.invoke(cli, ["export", run_id, "--out", str(tmp_path / "x.csv"), "--db", str(tmp_path / "none.sqlite")])
    assert r.exit_code == 2 and "no index at" in r.output
    monkeypatch.setattr(export_job.os, "access", lambda path, mode: False)  # tests run as root: simulate it
    r = runner.invoke(cli, ["export", run_id, "--out", str(tmp_path / "x.csv"), "--db", str(db)],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 2 and f"error: --out: directory {tmp_path} is not writable" in r.output
    assert list(tmp_path.iterdir()) == []


def test_export_leaves_out_a_damaged_cell_names_it_and_exits_1(done_run, cli, tmp_path):
    idx, run_id, db, res, _ = done_run
    victim = idx.run_cells(run_id)[3]
    path = result_file(res, victim)
    saved = path.read_bytes()
    try:
        path.write_bytes(saved[: len(saved) // 2])
        out = tmp_path / "part.parquet"
        r = runner.invoke(cli, ["export", run_id, "--out", str(out), "--db", str(db)], env={"COLUMNS": "300"})
        assert r.exit_code == 1, r.output
        assert f"cell {victim.id} left out: its result file is not usable (unreadable parquet: " in r.output
        table = pq.read_table(out)
        assert table.num_rows == 18 and victim.id not in set(table.column("cell_id").to_pylist())
    finally:
        path.write_bytes(saved)
    assert len(list_result_files(res)) == 10


def test_columns_null_in_some_cells_are_typed_as_in_the_others():
    """A ``full`` cell's rows have no resolved budget, a RULER cell's no depth: the columns are still int64 and
    float64, so a directory of cells reads as one dataset (``pd.read_parquet``) whichever file comes first."""
    cells = expand(parse_grid(GRID))
    full = next(c for c in cells if c.policy == "full")
    t = with_identity([{"id": "a", "resolved_budget": None, "depth": None}], cell_identity(full, "r9"))
    assert t.schema.field("resolved_budget").type == pa.int64() and t.schema.field("depth").type == pa.float64()
