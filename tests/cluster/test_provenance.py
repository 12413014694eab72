"""Provenance: collected on the worker (torch-free for stub cells), stored in ``cells.provenance``; an index
created by the older schema (no such column) gets the column on open and keeps its data."""
from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import postgresql, sqlite

from kdeval.cluster.provenance import collect_provenance
from kdeval.cluster.stub import StubWorkload
from kdeval.cluster.worker import CellWorker
from kdeval.cluster.workload import CellTask
from kdeval.storage import CellRecord, RunIndex, migrate, write_cell_rows
from kdeval.storage.tables import Base

KEYS = {"kdeval_version", "source_hash", "torch", "transformers", "cuda", "device", "dtype",
        "attn_implementation", "host", "python"}


def _task(**kw) -> CellTask:
    base = dict(cell_id="c0", model_id="stub:0", dtype="bfloat16", attn_implementation="sdpa", revision=None,
                policy="keydiff", policy_params={}, budget=64, chunk_size=32, task="needle", length=256,
                samples=2, seed=0)
    return CellTask(**{**base, **kw})


def test_stub_provenance_is_torch_free_in_a_fresh_process():
    code = ("import json, sys\n"
            "from kdeval.cluster.provenance import collect_provenance\n"
            "from kdeval.cluster.workload import CellTask\n"
            "t = CellTask(cell_id='c', model_id='stub:0', dtype='float16', attn_implementation='eager',\n"
            "             revision=None, policy='full', policy_params={}, budget=None, chunk_size=8, task='needle',\n"
            "             length=None, samples=1, seed=0)\n"
            "p = collect_provenance(t)\n"
            "from kdeval.version import source_hash\n"
            "print(json.dumps({'p': p, 'torch_loaded': 'torch' in sys.modules, 'hash': source_hash()}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    p = got["p"]
    assert not got["torch_loaded"]
    assert set(p) == KEYS
    assert (p["torch"], p["transformers"], p["cuda"]) == (None, None, None)
    assert (p["dtype"], p["attn_implementation"]) == ("float16", "eager")
    assert p["device"] == f"cpu {platform.processor() or platform.machine()}".strip()
    assert p["host"] == socket.gethostname() and p["source_hash"] == got["hash"]  # same process: files may change between two
    assert p["kdeval_version"] == __import__("kdeval").__version__


def test_provenance_names_torch_when_the_workload_loaded_it():
    torch = pytest.importorskip("torch")
    p = collect_provenance(_task())
    assert p["torch"] == str(torch.__version__) and p["cuda"] == torch.version.cuda
    if torch.cuda.is_available():
        assert p["device"] == torch.cuda.get_device_name(torch.cuda.current_device())
    else:
        assert p["device"].startswith("cpu")
    json.dumps(p)  # JSON-able as stored


def test_worker_returns_provenance_for_done_cells_only():
    worker = CellWorker(StubWorkload(fail_policies=("sink",)), "w0")
    ok = worker.run_cell(_task())
    assert ok.ok and set(ok.provenance) == KEYS and ok.provenance["dtype"] == "bfloat16"
    failed = worker.run_cell(_task(policy="sink"))
    assert not failed.ok and failed.provenance == {}


def _record(i: int) -> CellRecord:
    return CellRecord(id=f"cell{i}", spec={"i": i}, model="m", policy="keydiff", budget=64, chunk_size=32,
                      task="needle")


def test_old_schema_index_gains_the_provenance_column_and_keeps_its_data(paths):
    db, res = paths["db"], str(paths["results"])
    old = RunIndex.open(db)  # an index as the older schema made it: cells without `provenance`
    old.create_run("r1", name="n", grid_yaml="", grid_hash="h", results_dir=res, kdeval_version="0",
                   cells=[_record(0), _record(1)])
    att = old.start_attempt("r1", "cell0", "w", "n")
    rel = write_cell_rows(res, "cell0", [{"id": "s0", "score": 1.0}])
    with old.engine.begin() as conn:
        conn.execute(text("ALTER TABLE cells DROP COLUMN provenance"))
    with old.engine.connect() as conn:  # what the old code wrote: no provenance
        conn.execute(text("UPDATE cells SET state='done', results_dir=:d, result_path=:p, n_rows=1, "
                          "summary='{\"score\": 100.0}' WHERE id='cell0'"), {"d": res, "p": rel})
        conn.execute(text("UPDATE attempts SET state='done' WHERE id=:a"), {"a": att})
        conn.commit()
        cols = {r[1] for r in conn.execute(text("PRAGMA table_info(cells)"))}
    old.close()
    assert "provenance" not in cols

    idx = RunIndex.open(db)  # the new code opens it: the column is added, the data kept
    assert migrate.missing_columns(idx.engine) == []
    cell = idx.get_cell("cell0")
    assert (cell.state, cell.summary, cell.provenance) == ("done", {"score": 100.0}, None)
    assert idx.read_cell_rows("cell0") == [{"id": "s0", "score": 1.0}]
    att = idx.start_attempt("r1", "cell1", "w", "n")
    idx.finish_attempt_done(att, results_dir=res, result_path=rel, n_rows=1, summary={}, duration_s=0.1,
                            peak_memory_bytes=None, worker="w", node="n",
                            provenance={"device": "cpu x86_64", "torch": None})
    assert idx.get_cell("cell1").provenance == {"device": "cpu x86_64", "torch": None}
    idx.close()
    assert migrate.add_missing_columns(RunIndex.open(db).engine) == []  # opening again changes nothing


def test_a_column_added_by_another_process_meanwhile_is_tolerated(paths, monkeypatch):
    idx = RunIndex.open(paths["db"])
    col = Base.metadata.tables["cells"].c.provenance
    stale = iter([[col]])  # the first look still misses it; the ALTER then fails as a duplicate
    real = migrate.missing_columns
    monkeypatch.setattr(migrate, "missing_columns", lambda engine: next(stale, None) or real(engine))
    assert migrate.add_missing_columns(idx.engine) == []


def test_add_column_ddl_is_compiled_by_the_dialect():
    cells = Base.metadata.tables["cells"]
    ddl = migrate.AddColumn(cells, cells.c.provenance)
    assert str(ddl.compile(dialect=sqlite.dialect())) == "ALTER TABLE cells ADD COLUMN provenance JSON"
    assert str(ddl.compile(dialect=postgresql.dialect())) == "ALTER TABLE cells ADD COLUMN provenance JSON"


def test_provenance_names_the_dtype_the_model_was_loaded_in():
    class Loaded:
        dtype = "bfloat16"  # what a grid's dtype 'auto' resolved to on the worker

    assert collect_provenance(_task(), Loaded())["dtype"] == "bfloat16"
    assert collect_provenance(_task())["dtype"] == _task().dtype
