"""examples/paper/: the KeyDiff (arXiv 2504.15364) reproduction kit.

Every grid dry-runs offline through ``kdeval submit GRID --dry-run`` (typer's CliRunner, HF_HUB_OFFLINE=1, an
index path that does not exist and must still not exist afterwards) with the cell count worked out here from
the experiment, not from kdeval's expansion; every grid asks for A100 GPU workers and bfloat16 weights; the
README gives each grid's cluster command.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.evals.benchmarks import registry as task_registry

REPO = Path(__file__).resolve().parents[1]
KIT = REPO / "examples" / "paper"
runner = CliRunner()

LONGBENCH_POLICIES = ["full", "keydiff", "h2o", "tova", "snapkv", "sink"]
#: grid file -> cells: (tasks x lengths) x (1 full cell + evicting policies x budgets) x block sizes.
EXPECTED_CELLS = {
    "longbench_llama32_3b.yaml": 21 * (1 + 5 * 4),
    "longbench_llama31_8b.yaml": 21 * (1 + 5 * 4),
    "needle.yaml": 5 * (1 + 5 * 1),
    "math500.yaml": 1 * (1 + 2 * 2),
    "phonebook.yaml": 5 * (1 + 5 * 1),
    "ttft.yaml": 3 * (1 + 5 * 1) * 3,
    "kvpress_ruler4k.yaml": 13 * (1 + 6 * 4),
}
RULER_4K_TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                  "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]


def _grid(name: str) -> dict:
    return yaml.safe_load((KIT / name).read_text(encoding="utf-8"))


def _ruler_qa_files(root: Path) -> None:
    """Tiny SQuAD v2 / HotpotQA files in the official formats (RULER's qa_1 / qa_2 read them)."""
    (root / "ruler").mkdir(exist_ok=True)
    squad = {"data": [{"title": "t", "paragraphs": [
        {"context": f"Paragraph {i} says the code is {1000 + i}.",
         "qas": [{"question": f"What is code {i}?", "is_impossible": False, "answers": [{"text": str(1000 + i)}]}]}
        for i in range(20)]}]}
    hotpot = [{"question": f"Which city is {i}?", "answer": f"City{i}",
               "context": [[f"Title{i}", [f"City{i} is number {i}."]], [f"Other{i}", ["Nothing here."]]]}
              for i in range(20)]
    if not (root / "ruler" / "squad.json").exists():
        (root / "ruler" / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    if not (root / "ruler" / "hotpotqa.json").exists():
        (root / "ruler" / "hotpotqa.json").write_text(json.dumps(hotpot), encoding="utf-8")


@pytest.fixture(scope="module")
def kit_data_dir(data_dir: Path, tmp_path_factory) -> Path:
    """KDEVAL_DATA_DIR's contents (linked) plus RULER's QA files and a stand-in for kvpress's RULER-4K set when it
    lacks them (a real cluster has them)."""
    kvpress_set = Path("kvpress") / "ruler" / "4096.jsonl"
    if ((data_dir / "ruler" / "squad.json").is_file() and (data_dir / "ruler" / "hotpotqa.json").is_file()
            and (data_dir / kvpress_set).is_file()):
        return data_dir
    root = tmp_path_factory.mktemp("kit-data")
    for entry in data_dir.iterdir():
        if entry.name not in ("ruler", "kvpress"):
            (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (root / "ruler").mkdir()
    if (data_dir / "ruler").is_dir():
        for f in (data_dir / "ruler").iterdir():
            (root / "ruler" / f.name).symlink_to(f)
    _ruler_qa_files(root)
    (root / kvpress_set).parent.mkdir(parents=True)
    rows = [{"context": "c", "question": "q", "answer_prefix": "", "answer": ["a"], "task": t, "max_new_tokens": 8}
            for t in RULER_4K_TASKS]
    (root / kvpress_set).write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return root


def test_the_kit_holds_exactly_the_expected_grids():
    assert sorted(p.name for p in KIT.glob("*.yaml")) == sorted(EXPECTED_CELLS)


@pytest.mark.parametrize("name", sorted(EXPECTED_CELLS))
def test_grid_dry_runs_offline_with_its_cell_count(name, kit_data_dir, tmp_path):
    db = tmp_path / "no-such-dir" / "index.sqlite"
    env = {"KDEVAL_DATA_DIR": str(kit_data_dir), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "COLUMNS": "250"}
    r = runner.invoke(app, ["submit", str(KIT / name), "--dry-run", "--db", str(db)], env=env)
    n = EXPECTED_CELLS[name]
    assert r.exit_code == 0, r.output
    assert f"{_grid(name)['name']}: {n} cells, 0 already done, {n} to run" in r.output, r.output[:2000]
    assert not db.parent.exists()  # a dry run writes nothing


@pytest.mark.parametrize("name", sorted(EXPECTED_CELLS))
def test_grid_runs_on_a100_workers_in_bfloat16(name):
    g = _grid(name)
    assert g["resources"]["accelerator_type"] == "A100"
    assert g["resources"]["gpus_per_worker"] == 1 and g["resources"]["workers"] >= 1
    assert all(m["dtype"] == "bfloat16" for m in g["models"])


@pytest.mark.parametrize("name, model", [("longbench_llama32_3b.yaml", "meta-llama/Llama-3.2-3B-Instruct"),
                                         ("longbench_llama31_8b.yaml", "meta-llama/Llama-3.1-8B-Instruct")])
def test_longbench_grids_cover_every_task_from_the_hub(name, model):
    g = _grid(name)
    every = sorted(t for t in task_registry.task_names() if t.startswith("longbench."))
    assert len(every) == 21
    assert sorted(t["name"] for t in g["tasks"]) == every
    assert all(t["params"] == {"source": "hub"} and t["samples"] >= 500 for t in g["tasks"])
    assert [m["id"] for m in g["models"]] == [model]
    assert g["policies"] == LONGBENCH_POLICIES
    assert g["budgets"] == [2048, 4096, 6144, 8192] and g["chunk_sizes"] == [128]


def test_the_experiment_settings_the_issue_names():
    needle = _grid("needle.yaml")
    assert needle["budgets"] == [6144] and needle["tasks"][0]["name"] == "needle"
    assert len(needle["tasks"][0]["lengths"]) > 1 and len(needle["tasks"][0]["params"]["depths"]) > 1
    math = _grid("math500.yaml")
    assert math["models"][0]["id"] == "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
    assert math["policies"] == ["full", {"name": "keydiff-sw", "params": {"window_fraction": 0.2}}, "snapkv"]
    assert len(_grid("phonebook.yaml")["tasks"][0]["lengths"]) > 1
    assert _grid("ttft.yaml")["chunk_sizes"] == [64, 128, 256]
    kv = _grid("kvpress_ruler4k.yaml")
    assert kv["protocol"] == {"compress": "context", "decode": "keep"}
    assert [t["name"] for t in kv["tasks"]] == [f"ruler.{t}" for t in RULER_4K_TASKS]
    assert all(t["lengths"] == [4096] and t["params"] == {"source": "kvpress"} for t in kv["tasks"])
    # kvpress's leaderboard ratios r = 0.25 / 0.5 / 0.75 / 0.875 as shares 1 - r (kvpress's kept count per sample)
    assert kv["budgets"] == ["75%", "50%", "25%", "12.5%"]
    assert kv["chunk_sizes"] == ["whole"]  # one chunk holds the context: compressed once, as kvpress does


def test_readme_gives_each_grid_its_cluster_command():
    readme = (KIT / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED_CELLS:
        assert f"kdeval submit examples/paper/{name} --address auto" in readme, name
    for path in [KIT / "README.md", *KIT.glob("*.yaml")]:
        assert str(REPO.parent) not in path.read_text(encoding="utf-8"), path.name  # no path of this machine
