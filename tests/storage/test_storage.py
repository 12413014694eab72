"""Storage: schema round trip, attempts, Parquet atomic writes, WAL readers."""
from __future__ import annotations

import threading

import pyarrow.parquet as pq
from sqlalchemy import text

from kdeval.storage import (
    AttemptState, CellRecord, RunIndex, RunState, clean_temp_files, list_result_files, list_temp_files,
    write_cell_rows,
)


def _records(n: int) -> list[CellRecord]:
    return [CellRecord(id=f"cell{i:02d}", spec={"i": i}, model="m", policy="keydiff", budget=64,
                       chunk_size=32, task="needle") for i in range(n)]


def test_run_cells_attempts_round_trip(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="n", grid_yaml="x: 1", grid_hash="h", results_dir=str(paths["results"]),
                   kdeval_version="0", cells=_records(3))
    # a second run sharing two cells links them, it does not duplicate them
    idx.create_run("r2", name="n2", grid_yaml="x: 1", grid_hash="h", results_dir=str(paths["results"]),
                   kdeval_version="0", cells=_records(2))
    with idx.session() as s:
        assert s.execute(text("select count(*) from cells")).scalar() == 3
        assert s.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    a1 = idx.start_attempt("r1", "cell00", "w0", "node-a")
    idx.finish_attempt_failed(a1, state=AttemptState.LOST, error="node died", final=False)
    a2 = idx.start_attempt("r1", "cell00", "w1", "node-b")
    rel = write_cell_rows(paths["results"], "cell00", [{"id": "s0", "score": 1.0, "references": ["a", "b"]}])
    idx.finish_attempt_done(a2, results_dir=str(paths["results"]), result_path=rel, n_rows=1,
                            summary={"score": 100.0}, duration_s=0.5, peak_memory_bytes=3 << 30,
                            worker="w1", node="node-b")
    a3 = idx.start_attempt("r1", "cell01", "w0", "node-a")
    idx.finish_attempt_failed(a3, state=AttemptState.FAILED, error="Traceback...\nValueError: boom", final=True)

    run = idx.get_run("r1")
    assert run.counts == {"done": 1, "failed": 1, "pending": 1}
    assert idx.get_run("r2").counts == {"done": 1, "failed": 1}
    cell = idx.get_cell("cell00")
    assert (cell.state, cell.n_attempts, cell.worker, cell.node) == ("done", 2, "w1", "node-b")
    assert cell.peak_memory_bytes == 3 << 30 and cell.summary == {"score": 100.0}
    assert [a.state for a in idx.cell_attempts("cell00")] == ["lost", "done"]
    assert idx.get_cell("cell01").error_line == "ValueError: boom"
    assert idx.read_cell_rows("cell00") == [{"id": "s0", "score": 1.0, "references": ["a", "b"]}]
    assert idx.read_cell_table("cell00").num_rows == 1
    assert idx.resolve_run_id("r") is None  # ambiguous prefix
    assert [r.id for r in idx.list_runs()] == ["r2", "r1"]


def test_recover_orphans_marks_running_attempts_lost(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="n", grid_yaml="", grid_hash="h", results_dir=str(paths["results"]),
                   kdeval_version="0", cells=_records(2))
    idx.start_driver("r1", "host", 1)
    idx.start_attempt("r1", "cell00", "w0", "n")
    assert idx.recover_orphans("r1") == 1
    assert idx.get_cell("cell00").state == "pending"
    assert [a.state for a in idx.cell_attempts("cell00")] == ["lost"]
    idx.set_run_state("r1", RunState.CANCELLED)
    assert idx.heartbeat("r1") == "cancelled"


def test_parquet_atomic_write_and_temp_cleanup(paths):
    res = paths["results"]
    rel = write_cell_rows(res, "abcdef", [{"id": str(i), "score": float(i)} for i in range(5)])
    assert rel == "cells/ab/abcdef.parquet"
    assert pq.read_table(res / rel).num_rows == 5
    assert list_temp_files(res) == []
    orphan = res / "cells" / "ab" / "_tmp-abcdef-999.parquet"
    orphan.write_bytes(b"partial")
    assert list_result_files(res) == [res / rel]  # temp files are never counted as results
    assert clean_temp_files(res) == 1 and not orphan.exists()
    # rewrite replaces in place (no duplicate files)
    write_cell_rows(res, "abcdef", [{"id": "0", "score": 1.0}])
    assert len(list_result_files(res)) == 1 and pq.read_table(res / rel).num_rows == 1


def test_readers_never_fail_while_a_writer_writes(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="n", grid_yaml="", grid_hash="h", results_dir=str(paths["results"]),
                   kdeval_version="0", cells=_records(40))
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        reader = RunIndex.open(paths["db"])
        try:
            while not stop.is_set():
                reader.list_runs()
                reader.run_cells("r1")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    for i in range(40):
        a = idx.start_attempt("r1", f"cell{i:02d}", "w", "n")
        idx.finish_attempt_failed(a, state=AttemptState.FAILED, error="x", final=True)
    stop.set()
    t.join(timeout=30)
    assert not errors
    assert idx.get_run("r1").counts == {"failed": 40}


def test_rows_with_different_columns_keep_every_column(paths):
    rel = write_cell_rows(paths["results"], "c1", [{"id": "a", "score": 1.0},
                                                   {"id": "b", "score": 0.0, "rouge": 0.5, "length": None}])
    rows = pq.read_table(paths["results"] / rel).to_pylist()
    assert rows == [{"id": "a", "score": 1.0, "rouge": None, "length": None},
                    {"id": "b", "score": 0.0, "rouge": 0.5, "length": None}]
