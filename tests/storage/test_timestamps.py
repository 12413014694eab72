"""Timestamps of the index are aware UTC in SQLite too (it stores them naive); ages and JSON agree."""
from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone

from sqlalchemy import update
from sqlalchemy.dialects import postgresql, sqlite

from kdeval.storage import RunIndex, age_seconds, to_jsonable
from kdeval.storage.tables import Run, UTCDateTime, as_utc

NEW_YORK_WINTER = timezone(timedelta(hours=-5))


def test_sqlite_round_trip_is_aware_utc(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="g", grid_yaml="", grid_hash="h", results_dir="/r", kdeval_version="v", cells=[])
    idx.start_driver("r1", "host", 123)
    run = idx.get_run("r1")
    for ts in (run.created_at, run.started_at, run.heartbeat_at):
        assert ts.tzinfo is not None and ts.utcoffset() == timedelta(0)
        assert abs((datetime.now(timezone.utc) - ts).total_seconds()) < 30
    assert 0 <= age_seconds(run.heartbeat_at) < 30
    got = json.loads(json.dumps(to_jsonable(run, drop=("grid_yaml",))))
    assert datetime.fromisoformat(got["heartbeat_at"]) == run.heartbeat_at
    assert got["heartbeat_at"].endswith("+00:00")
    idx.close()
    # what SQLite holds: naive UTC text, the same instant
    with sqlite3.connect(paths["db"]) as conn:
        stored = conn.execute("SELECT heartbeat_at FROM runs").fetchone()[0]
    assert datetime.fromisoformat(stored).replace(tzinfo=timezone.utc) == run.heartbeat_at


def test_values_in_another_zone_are_stored_as_the_same_instant(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="g", grid_yaml="", grid_hash="h", results_dir="/r", kdeval_version="v", cells=[])
    local = datetime(2026, 1, 15, 7, 30, tzinfo=NEW_YORK_WINTER)  # 12:30 UTC
    with idx.session() as s, s.begin():
        s.execute(update(Run).where(Run.id == "r1").values(heartbeat_at=local))
    assert idx.get_run("r1").heartbeat_at == datetime(2026, 1, 15, 12, 30, tzinfo=timezone.utc)


def test_bind_and_result_per_dialect():
    t = UTCDateTime()
    aware = datetime(2026, 1, 15, 7, 30, tzinfo=NEW_YORK_WINTER)
    utc = datetime(2026, 1, 15, 12, 30, tzinfo=timezone.utc)
    assert t.process_bind_param(aware, postgresql.dialect()) == utc  # timestamptz: an aware UTC instant
    assert t.process_bind_param(aware, postgresql.dialect()).tzinfo is not None
    assert t.process_bind_param(aware, sqlite.dialect()) == utc.replace(tzinfo=None)  # SQLite: naive UTC
    assert t.process_bind_param(utc.replace(tzinfo=None), sqlite.dialect()) == utc.replace(tzinfo=None)
    assert t.process_result_value(utc.replace(tzinfo=None), sqlite.dialect()) == utc
    assert t.process_result_value(aware, postgresql.dialect()).tzinfo == timezone.utc
    assert t.process_bind_param(None, sqlite.dialect()) is None and as_utc(None) is None


def test_age_seconds_takes_naive_as_utc():
    now = datetime.now(timezone.utc)
    assert abs(age_seconds(now - timedelta(seconds=90)) - 90) < 5
    assert abs(age_seconds((now - timedelta(seconds=90)).replace(tzinfo=None)) - 90) < 5
    assert abs(age_seconds((now - timedelta(seconds=90)).astimezone(NEW_YORK_WINTER)) - 90) < 5
    assert age_seconds(None) is None
