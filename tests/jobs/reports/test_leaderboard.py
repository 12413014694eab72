"""The leaderboard on synthetic stored results: pairing across runs, one row per cell id, code versions apart."""
from __future__ import annotations

import pytest

from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard
from kdeval.jobs.reports.leaderboard.cells import Filters, LeaderboardInputError
from kdeval.storage import RunState
from tests.jobs.reports.helpers import FakeCell, provenance, rows, store_run

OPT = LeaderboardOptions(resamples=200, seed=1)


def _only(board, policy, **match):
    found = [r for r in board.rows if r.policy == policy and all(getattr(r, k) == v for k, v in match.items())]
    assert len(found) == 1, found
    return found[0]


def test_full_in_one_run_and_a_policy_in_another_pair_by_sample_id(store):
    idx, res = store
    # the full cache has s0..s9; the keydiff run has s2..s11 in another order: 8 samples pair
    store_run(idx, res, "ra", [FakeCell("full", None, rows=rows([1.0] * 10))])
    kd_ids = [f"s{i}" for i in range(11, 1, -1)]
    kd_scores = [0.0 if i in (3, 4) else 1.0 for i in range(11, 1, -1)]  # s3 and s4 lost, s10/s11 unpaired
    store_run(idx, res, "rb", [FakeCell("keydiff", 256, rows=rows(kd_scores, ids=kd_ids))])
    board = build_leaderboard(idx, Filters(), OPT)
    kd = _only(board, "keydiff")
    assert kd.n == 10 and kd.n_paired == 8
    assert kd.delta == pytest.approx(-25.0)  # 2 of the 8 paired samples lost, whatever s10/s11 scored
    assert kd.value == pytest.approx(80.0)
    full = _only(board, "full")
    assert kd.ref_cell == full.cell and full.state == "reference" and kd.runs == "rb"
    assert "another run" in kd.ref_note and kd.ci_low <= kd.delta <= kd.ci_high


def test_same_cell_in_two_runs_is_one_row(store):
    idx, res = store
    cells = [FakeCell("full", None, rows=rows([1.0] * 4)), FakeCell("keydiff", 256, rows=rows([1, 0, 1, 1]))]
    store_run(idx, res, "r1", cells)
    store_run(idx, res, "r2", cells)  # the same ids: the second run reuses both cells
    board = build_leaderboard(idx, Filters(), OPT)
    assert len(board.rows) == 2
    kd = _only(board, "keydiff")
    assert set(kd.runs.split()) == {"r1", "r2"} and kd.variant == "" and kd.ref_note == ""
    assert kd.delta == pytest.approx(-25.0)


def test_two_code_versions_are_never_merged(store):
    idx, res = store
    store_run(idx, res, "old", [FakeCell("full", None, rows=rows([1.0] * 4), provenance=provenance(source_hash="aaa")),
                                FakeCell("keydiff", 256, rows=rows([0, 0, 0, 0]), provenance=provenance(source_hash="aaa"))],
              version="v1")
    store_run(idx, res, "new", [FakeCell("full", None, rows=rows([0.5] * 4), provenance=provenance(source_hash="bbb")),
                                FakeCell("keydiff", 256, rows=rows([1, 1, 1, 1]), provenance=provenance(source_hash="bbb"))],
              version="v2")
    board = build_leaderboard(idx, Filters(), OPT)
    kds = [r for r in board.rows if r.policy == "keydiff"]
    assert sorted(r.code for r in kds) == ["v1", "v2"]  # two rows, never one pooled score
    by_code = {r.code: r for r in kds}
    assert by_code["v1"].value == 0.0 and by_code["v2"].value == 100.0
    # each is paired with the full cache its own run computed, not with the other version's
    assert by_code["v1"].delta == pytest.approx(-100.0) and by_code["v2"].delta == pytest.approx(50.0)
    assert all("kdeval_version" in r.variant for r in board.rows)
    assert any("never merged" in w for w in board.meta.warnings)


def test_a_full_cache_of_other_code_is_flagged(store):
    idx, res = store
    store_run(idx, res, "ra", [FakeCell("full", None, rows=rows([1.0] * 4), provenance=provenance(source_hash="aaa"))])
    store_run(idx, res, "rb", [FakeCell("snapkv", 64, rows=rows([1.0] * 4), provenance=provenance(source_hash="bbb"))])
    board = build_leaderboard(idx, Filters(), OPT)
    assert "other code: code aaa, this cell bbb" in _only(board, "snapkv").ref_note
    assert any("may mix code versions" in w for w in board.meta.warnings)


def test_keys_pair_only_within_length_seed_and_chunk(store):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 3), length=1024),
                               FakeCell("full", None, rows=rows([0.0] * 3), length=2048, chunk=32),
                               FakeCell("sink", 64, rows=rows([0.0] * 3), length=2048, chunk=64)])
    sink = _only(build_leaderboard(idx, Filters(), OPT), "sink")
    assert sink.state == "missing" and sink.delta is None and "no full-cache cell" in sink.ref_note


def test_ranking_filters_and_fields(store):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 4)),
                               FakeCell("keydiff", 256, rows=rows([1, 1, 1, 0])),
                               FakeCell("sink", 256, rows=rows([1, 0, 0, 0])),
                               FakeCell("snapkv", 256, rows=rows([1, 1, 0, 0]), protocol={"compress": "context"}),
                               FakeCell("keydiff", 256, task="ruler.niah_single_1", rows=rows([1, 1, 1, 1]),
                                        model="other")])
    board = build_leaderboard(idx, Filters(models=("m",)), LeaderboardOptions(order="delta", resamples=0))
    assert [(r.rank, r.policy) for r in board.rows] == [(1, "full"), (2, "keydiff"),
                                                        (3, "snapkv [query-agnostic]"), (4, "sink")]
    snap = _only(board, "snapkv [query-agnostic]")
    assert snap.protocol == "context/evict" and snap.kv_quant == "" and snap.peak_kv_bytes == 256 * 1024
    assert snap.kv_bytes_ratio == pytest.approx(1.0) and snap.ttft_median_s == pytest.approx(0.5)
    assert snap.decode_tok_s == pytest.approx(5.0)
    only = build_leaderboard(idx, Filters(protocols=("query-agnostic",)), OPT)
    assert [r.policy for r in only.rows] == ["snapkv [query-agnostic]"]
    assert _only(only, "snapkv [query-agnostic]").delta == pytest.approx(-50.0)  # its reference is still read
    assert [r.policy for r in build_leaderboard(idx, Filters(policies=("sink",)), OPT).rows] == ["sink"]
    assert [r.model for r in build_leaderboard(idx, Filters(tasks=("ruler",)), OPT).rows] == ["other"]
    assert build_leaderboard(idx, Filters(tasks=("math500",)), OPT).rows == []  # known task, nothing done


@pytest.mark.parametrize("filters, words", [
    (Filters(models=("mx",)), "--model mx: unknown model (did you mean 'm'?); the index has m"),
    (Filters(tasks=("neddle",)), "--task neddle: unknown task (did you mean 'needle'?)"),
    (Filters(protocols=("query-awre",)), "did you mean 'query-aware'?"),
    (Filters(policies=("keydif",)), "did you mean 'keydiff'?"),
    (Filters(runs=("nope",)), "--run nope: no such run"),
])
def test_bad_filters_are_bad_input(store, filters, words):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0])), FakeCell("keydiff", 64, rows=rows([1.0]))])
    with pytest.raises(LeaderboardInputError) as e:
        build_leaderboard(idx, filters, OPT)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_empty_index_and_running_run_are_bad_input(store, monkeypatch):
    idx, res = store
    with pytest.raises(LeaderboardInputError, match="the index has no runs"):
        build_leaderboard(idx, Filters(), OPT)
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0])), FakeCell("keydiff", 64, pending=True)],
              state=RunState.RUNNING)
    monkeypatch.setattr("kdeval.jobs.reports.leaderboard.cells.driver_alive", lambda run: run.id == "r1")
    with pytest.raises(LeaderboardInputError, match="r1 is still in progress .1 of 2 cells done"):
        build_leaderboard(idx, Filters(runs=("r1",)), OPT)
    board = build_leaderboard(idx, Filters(), OPT)  # without --run: its done cells, said so
    assert [r.policy for r in board.rows] == ["full"] and "still in progress" in board.meta.notes[0]
