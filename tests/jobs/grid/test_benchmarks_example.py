"""examples/benchmarks.yaml: validates against the fixtures (a slice of each new benchmark); without the data
every data-backed task is refused at submit, exit 2, naming its file and the hub option."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[3]
GRID = REPO / "examples" / "benchmarks.yaml"
FIXTURES = REPO / "tests" / "fixtures"


def test_example_grid_dry_runs_on_the_fixtures(app, paths, monkeypatch):
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(FIXTURES))
    res = CliRunner().invoke(app, ["submit", str(GRID), "--db", str(paths["db"]), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "18 cells, 0 already done, 18 to run" in res.output
    assert not paths["db"].exists()


def test_missing_data_is_refused_at_submit(app, paths, monkeypatch, tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(empty))
    res = CliRunner().invoke(app, ["submit", str(GRID), "--db", str(paths["db"]), "--dry-run"], terminal_width=400)
    assert res.exit_code == 2
    out = "".join(res.output.split())  # the terminal may wrap anywhere, even inside a path
    for rel in ("longbench2/data.json", "infinitebench/longbook_qa_eng.jsonl", "infinitebench/longbook_choice_eng.jsonl",
                "loogle/shortdep_qa.jsonl", "loogle/longdep_qa.jsonl", "aime2025/aime2025-I.jsonl"):
        assert f"datafilenotfound:{empty}/{rel}" in out, rel
    assert out.count("`params:{source:hub}`") == 6 and "infinitebench.passkey" not in out
    assert not paths["db"].exists()


def test_a_synthetic_slice_smaller_than_asked_says_why(paths):
    from kdeval.jobs.grid.cells import expand_grid
    from kdeval.jobs.grid.load import parse_grid

    grid = parse_grid("""
models: [random:llama-tiny]
policies: [full]
chunk_sizes: [64]
tasks: [{name: infinitebench.passkey, lengths: [512], samples: 4, params: {depths: [50]}}]
""")
    notes = expand_grid(grid, version="0+test").notes
    assert notes == ["tasks[0].samples: infinitebench.passkey at length 512 has 1 samples (one per depth of params.depths "
                     "(default: 0, 25, 50, 75, 100) × params.repeats per length); the cell runs 1, not 4"]
