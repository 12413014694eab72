"""What a reasoning answer cost against the full cache (paired by sample): the change in generated length,
decode tokens per solved problem and the share of traces cut at ``max_new_tokens``, in the report's rows
and tables, for cells of the prompt-kept protocol (``compress: generated``) against the full cache."""
from __future__ import annotations

import pytest

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.formats import from_json, to_json, to_markdown
from tests.jobs.reports.helpers import FakeCell, rows, store_run

KEPT = {"compress": "generated", "decode": "evict"}
CAP = 64


def traces(scores: list[float], tokens: list[int]) -> list[dict]:
    """Rows of math500 samples ``m0, m1, ...``: their scores and generated tokens, capped at :data:`CAP`."""
    return rows(scores, task="math500", length=None, prefix="m",
                extra=lambda i: {"generated_tokens": tokens[i], "max_new_tokens": CAP,
                                 "hit_max_new_tokens": tokens[i] >= CAP})


@pytest.fixture
def report(store):
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, task="math500", length=None, rows=traces([1, 1, 0, 1], [20, 30, 64, 40])),
        FakeCell("keydiff", 16, task="math500", length=None, protocol=KEPT,
                 rows=traces([1, 0, 0, 1], [30, 64, 64, 50])),
        FakeCell("random", 16, task="math500", length=None, protocol=KEPT,
                 rows=traces([0, 0, 0, 0], [64, 64, 64, 64])),
    ])
    return build_report(idx, ["r1"], ReportOptions(resamples=200))


def test_length_cost_per_solved_and_capped_traces_against_the_full_cache(report):
    by = {r.policy: r for r in report.answer_length}
    kd = by["keydiff [prompt-kept]"]
    # keydiff: 30 + 64 + 64 + 50 = 208 tokens for 2 solved; the full cache 154 tokens for 3 solved
    assert (kd.n_paired, kd.tokens, kd.ref_tokens, kd.delta) == (4, 52.0, 38.5, 13.5)
    assert (kd.per_solved, kd.ref_per_solved) == (104.0, pytest.approx(154 / 3))
    assert (kd.capped, kd.ref_capped) == (0.5, 0.25)
    rnd = by["random [prompt-kept]"]
    assert rnd.per_solved is None and rnd.capped == 1.0  # nothing solved: the tokens bought nothing
    assert from_json(to_json(report)).answer_length == report.answer_length


def test_the_markdown_table_shows_them(report):
    md = to_markdown(report)
    assert "tok/solved" in md and "ref capped" in md
    line = next(x for x in md.splitlines() if "keydiff [prompt-kept]" in x and "104.0" in x)
    assert "51.3" in line and "50%" in line and "25%" in line
