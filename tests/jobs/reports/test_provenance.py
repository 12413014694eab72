"""Provenance in reports: every compared cell's provenance in the JSON, a compact section in the HTML, and a
one-line warning (terminal, md, html, json) when the compared cells differ in device or code version."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.provenance import combinations
from kdeval.jobs.reports.render import formats
from kdeval.jobs.reports.render.html import render_html
from tests.jobs.reports import readers
from tests.jobs.reports.helpers import FakeCell, provenance, rows, store_run


def _run(store, *provs, run="r1", version="v1"):
    """A run of full, keydiff and sink cells with the given provenances (the last one repeats)."""
    idx, res = store
    provs = list(provs) + [provs[-1]] * (3 - len(provs))
    store_run(idx, res, run, [FakeCell("full", None, rows=rows([1.0] * 4), provenance=provs[0]),
                              FakeCell("keydiff", 256, rows=rows([0.5] * 4), provenance=provs[1]),
                              FakeCell("sink", 256, rows=rows([0.0] * 4), provenance=provs[2])], version=version)
    return build_report(idx, [run], ReportOptions(resamples=0))


def test_matching_provenance_is_carried_and_gives_no_warning(store):
    rep = _run(store, provenance())
    assert rep.meta.warnings == []
    assert [(p.policy, p.device, p.source_hash, p.torch, p.cuda, p.attn_implementation) for p in rep.provenance] == [
        ("full", "cpu", "abc123", "2.13.0", "", "sdpa"),
        ("keydiff", "cpu", "abc123", "2.13.0", "", "sdpa"),
        ("sink", "cpu", "abc123", "2.13.0", "", "sdpa")]
    data = json.loads(formats.to_json(rep))
    assert data["meta"]["warnings"] == [] and len(data["provenance"]) == 3
    assert data["provenance"][1]["host"] == "node0" and data["provenance"][1]["cell"] == rep.provenance[1].cell
    assert formats.from_json(formats.to_json(rep)) == rep
    [(setup, members)] = combinations(rep.provenance)
    assert setup["device"] == "cpu" and len(members) == 3
    page = render_html(rep, [])
    assert "<h2>Provenance</h2>" in page and "keydiff N=256 needle@1024#s0 (run r1)" in page
    assert 'class="warning"' not in page
    assert readers.read_html_tables(page)["provenance"] == rep.provenance


def test_device_mismatch_warns_in_every_format(store, tmp_path):
    idx, _ = store
    rep = _run(store, provenance(device="cuda:0 NVIDIA H200"), provenance(device="cpu"))
    [warning] = rep.meta.warnings
    assert "differ in device (2 cells cpu, 1 cuda:0 NVIDIA H200)" in warning and "code version" not in warning
    assert "\n" not in warning
    assert f"- **warning**: {warning}" in formats.to_markdown(rep)
    assert json.loads(formats.to_json(rep))["meta"]["warnings"] == [warning]
    page = render_html(rep, [])
    assert '<p class="warning"><b>warning:</b> the compared cells differ in device' in page
    assert len(combinations(rep.provenance)) == 2
    res = CliRunner().invoke(app, ["report", "r1", "--db", str(idx.engine.url), "--resamples", "0"])
    assert res.exit_code == 0, res.output
    [line] = [ln for ln in res.output.splitlines() if "warning:" in ln]
    assert line == f"warning: {warning}"
    out = CliRunner().invoke(app, ["report", "r1", "--db", str(idx.engine.url), "--resamples", "0",
                                   "--format", "json"])
    assert json.loads(out.stdout)["meta"]["warnings"] == [warning] and f"warning: {warning}" in out.stderr


def test_code_version_mismatch_warns(store):
    rep = _run(store, provenance(source_hash="abc123"), provenance(source_hash="fff999"))
    [warning] = rep.meta.warnings
    assert "differ in code version (2 cells fff999, 1 abc123)" in warning and "device" not in warning


def test_compare_run_counts_the_reference_cells(store):
    _run(store, provenance(device="cuda:0 A100"), run="before", version="v1")
    idx, _ = store
    _run(store, provenance(device="cuda:0 H100"), run="after", version="v2")
    rep = build_report(idx, ["after"], ReportOptions(compare="before", resamples=0))
    assert {p.run for p in rep.provenance} == {"before", "after"} and len(rep.provenance) == 6
    [warning] = rep.meta.warnings
    assert "3 cells cuda:0 A100, 3 cuda:0 H100" in warning or "3 cells cuda:0 H100, 3 cuda:0 A100" in warning


def test_cells_without_provenance_are_listed_blank_and_not_counted(store):
    rep = _run(store, None, provenance())  # the full cell was recorded by older code
    assert rep.meta.warnings == []
    full = next(p for p in rep.provenance if p.policy == "full")
    assert full.device == "" and full.source_hash == ""
    [(_, known), (blank, unknown)] = combinations(rep.provenance)
    assert len(known) == 2 and set(blank.values()) == {""} and [r.policy for r in unknown] == ["full"]
    assert '<td class="txt">-</td>' * 8 + '<td class="txt fold">full needle@1024#s0 (run r1)</td>' in render_html(rep, [])
