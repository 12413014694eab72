"""kdeval.api: the documented example runs as written (random:llama-tiny on a local Ray), returns one row per
sample with the run's identity columns, reuses the cells the CLI would (same ids, same index), and reports
bad input naming the field before anything is written."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import kdeval.api as api
from kdeval.jobs.grid.errors import GridError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
SECTION = "## run_grid and load_results"
IDENTITY = ["run_id", "cell_id", "model", "policy", "params", "budget", "budget_share", "chunk_size", "task",
            "length", "seed", "dtype", "protocol"]


def docstring_example() -> str:
    """The example of ``kdeval.api``'s docstring (the indented block after "Example")."""
    doc = api.__doc__
    block = doc[doc.index("::\n") + 3: doc.index(":func:`run_grid`")]
    return textwrap.dedent(block).strip() + "\n"


@pytest.fixture(scope="module", autouse=True)
def _ray_down():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example run in a fresh directory (its default index and results land there): its namespace."""
    here = tmp_path_factory.mktemp("notebook")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(here)
        namespace: dict = {"__name__": "example"}
        exec(compile(docstring_example(), "kdeval.api example", "exec"), namespace)
    namespace["here"] = here
    return namespace


def test_example_returns_one_row_per_sample_with_identity_columns(example):
    df = example["df"]
    assert list(df.columns[: len(IDENTITY)]) == IDENTITY
    assert len(df) == 3 * 2 and set(df["policy"]) == {"full", "keydiff", "sink"}
    assert df.attrs["cells"] == 3 and df.attrs["reused"] == 0 and df.attrs["failed"] == {}
    assert str(df["budget"].dtype) == "Int64"  # 128, and <NA> for the full cache (not 128.0 and NaN)
    assert df.loc[df["policy"] == "full", "budget"].isna().all() and set(df["budget"].dropna()) == {128}
    assert df["score"].between(0, 1).all() and (df["peak_kv_bytes"] > 0).all()
    again = example["again"]
    assert sorted(again["cell_id"]) == sorted(df["cell_id"]) and again.attrs["run_id"] == df.attrs["run_id"]
    assert (example["here"] / ".kdeval" / "index.sqlite").is_file()


def test_a_second_call_and_the_cli_reuse_the_same_cells(example, tmp_path):
    here = example["here"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(here)
        second = api.run_grid(example["grid"])
        assert second.attrs["reused"] == 3 and second.attrs["run_id"] != example["df"].attrs["run_id"]
        assert sorted(second["cell_id"]) == sorted(example["df"]["cell_id"])
        grid_file = tmp_path / "grid.yaml"
        grid_file.write_text(yaml.safe_dump(example["grid"]))
        from kdeval.cli.app import app

        res = CliRunner().invoke(app, ["submit", str(grid_file)])
    assert res.exit_code == 0, res.output
    assert "3 cells, 3 already done, 0 to run" in res.output  # the CLI finds the API's cells done


def test_grid_file_and_yaml_text_give_the_same_cells(example, tmp_path):
    text = yaml.safe_dump(example["grid"])
    (tmp_path / "g.yaml").write_text(text)
    from_file, from_text, from_map = api.read_grid(tmp_path / "g.yaml"), api.read_grid(text), api.read_grid(example["grid"])
    assert from_file[0] == from_text[0] == from_map[0]
    assert api.read_grid(from_map[0])[0] == from_map[0]  # a GridSpec goes through as it is


def test_bad_input_names_the_field_and_writes_nothing(tmp_path):
    db = tmp_path / "index.sqlite"
    bad = {"name": "x", "models": ["random:llama-tiny"], "policies": ["full"], "budgts": [64],
           "chunk_sizes": [32], "tasks": [{"name": "needle"}]}
    with pytest.raises(GridError, match=r"budgts: unknown field \(did you mean 'budgets'\?\)"):
        api.run_grid(bad, db=db)
    assert not db.exists()
    with pytest.raises(TypeError, match="grid_or_path: expected a grid file path"):
        api.run_grid(42, db=db)
    with pytest.raises(ValueError, match="db: no index at"):
        api.load_results(db)
    assert not db.exists()


def test_load_results_unknown_run(example):
    with pytest.raises(ValueError, match="run: no run 'nope'"):
        api.load_results(example["here"] / ".kdeval" / "index.sqlite", run="nope")


def test_readme_shows_the_same_example():
    """The Python API page (docs/python-api.md) shows this example; this keeps them equal."""
    text = PAGE.read_text(encoding="utf-8")
    assert f"\n{SECTION}" in text, f"docs/python-api.md has no '{SECTION}' section"
    start = text.index(f"\n{SECTION}")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"^```python\n(.*?)^```$", text[start: end if end != -1 else len(text)], flags=re.S | re.M)
    assert docstring_example() in blocks
