"""The plugin options as a user meets them: `kdeval policies --plugin` lists the policy with where it came from,
`submit` with a bad plugin (or a grid naming a plugin policy without it) is one line, exit 2, nothing written;
`check-policy` passes a correct plugin and gives the first counterexample of one that breaks the bound."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.cluster import plugins

from .helpers import write_newest

BREAKS_BOUND = '''
from dataclasses import dataclass

from kdeval.keydiff.policy.interface import Policy


@dataclass
class Greedy(Policy):
    """Keeps N + 4 tokens in every layer: its budgets sum to more than layers x N."""

    name = "greedy"
    rule = "keep the highest key norms"

    def score(self, keys, ctx):
        return keys.norm(dim=-1)

    def layer_budgets(self, budget, num_layers):
        return [budget + 4] * num_layers
'''


@pytest.fixture(autouse=True)
def _forget_plugins():
    yield
    for module in list(plugins._LOADED):
        plugins._unload(module)


def test_policies_lists_a_plugin_policy_with_its_origin(tmp_path):
    path = write_newest(tmp_path)
    res = CliRunner().invoke(app, ["policies", "--json", "--plugin", str(path)])
    assert res.exit_code == 0, res.output
    by_name = {p["name"]: p for p in json.loads(res.output)}
    assert by_name["newest"]["origin"] == "plugin file my_newest.py"
    assert by_name["newest"]["params"] == [{"name": "n_sink_tokens", "type": "int", "default": 0}]
    assert by_name["snapkv"]["origin"] == "built-in"
    table = CliRunner().invoke(app, ["policies", "--plugin", str(path)], env={"COLUMNS": "220"})
    line = next(ln for ln in table.output.splitlines() if ln.startswith("newest "))
    assert "keep the N most recent tokens" in line and line.rstrip().endswith("plugin file my_newest.py")


def _grid(tmp_path, policy: str = "newest"):
    grid = {"name": "g", "models": ["random:llama-tiny"], "policies": [policy], "budgets": [32], "chunk_sizes": [16],
            "tasks": [{"name": "needle", "lengths": [512], "samples": 1, "params": {"haystack": "noise"}}]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


@pytest.mark.parametrize("case", ["import", "missing"])
def test_submit_with_a_bad_plugin_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    bad = tmp_path / "broken.py"
    if case == "import":
        bad.write_text("raise RuntimeError('boom at import')\n")
    db = tmp_path / "index.sqlite"
    res = CliRunner().invoke(app, ["submit", str(_grid(tmp_path)), "--db", str(db), "--results-dir",
                                   str(tmp_path / "results"), "--plugin", str(bad)])
    assert res.exit_code == 2
    want = ("import failed: RuntimeError: boom at import" if case == "import" else
            "no such file (expected a .py file or an importable module name)")
    assert res.output.strip() == f"error: plugin {bad}: {want}"
    assert not db.exists() and not (tmp_path / "results").exists()


def test_a_grid_naming_a_plugin_policy_without_the_plugin_names_it(tmp_path):
    db = tmp_path / "index.sqlite"
    res = CliRunner().invoke(app, ["submit", str(_grid(tmp_path)), "--db", str(db), "--dry-run"])
    assert res.exit_code == 2 and "policies[0].name: unknown policy 'newest'" in res.output and not db.exists()
    path = write_newest(tmp_path / "p")
    res = CliRunner().invoke(app, ["submit", str(_grid(tmp_path, "newest")), "--dry-run", "--db", str(db),
                                   "--plugin", str(path)], env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    assert "newest N=32 B=16" in res.output
    res = CliRunner().invoke(app, ["submit", str(_grid(tmp_path)), "--dry-run", "--plugin", str(path), "--db",
                                   str(db)])
    bad = yaml.safe_load(_grid(tmp_path).read_text())
    bad["policies"] = [{"name": "newest", "params": {"n_sink_tokens": -2}}]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    res = CliRunner().invoke(app, ["submit", str(tmp_path / "bad.yaml"), "--dry-run", "--db", str(db), "--plugin",
                                   str(path)])
    assert res.exit_code == 2 and "n_sink_tokens: expected >= 0, got -2" in res.output  # validated at submit


def test_check_policy_gives_the_first_counterexample_of_a_policy_that_breaks_the_bound(tmp_path):
    path = tmp_path / "greedy_plugin.py"
    path.write_text(textwrap.dedent(BREAKS_BOUND))
    res = CliRunner().invoke(app, ["check-policy", "greedy", "--plugin", str(path), "--family", "llama", "--json"])
    assert res.exit_code == 1
    findings = [json.loads(line) for line in res.output.splitlines()]
    bound = [f for f in findings if f["check"] == "N + B bound"]
    assert [f["status"] for f in bound] == ["fails", "fails"]  # float32 and bfloat16
    assert bound[0]["detail"] == ("llama, layer 0, step 3 (seen 48): the full layers hold [44, 44, 44] tokens per KV "
                                  "head, 132 in all, more than 3 layers x min(N=40, seen) = 120; layer 0 keeps "
                                  "positions [0, 1, 2] ... [45, 46, 47]")


def test_check_policy_on_a_correct_plugin_holds_and_a_bad_name_is_exit_2(tmp_path):
    path = write_newest(tmp_path)
    res = CliRunner().invoke(app, ["check-policy", "newest", "--plugin", str(path), "--family", "llama"],
                             env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "check-policy newest (plugin file my_newest.py): 6 checks on 1 families"
    assert sum(ln.startswith("holds ") for ln in lines) == 7 and lines[-1].startswith("all 7 hold in ")
    res = CliRunner().invoke(app, ["check-policy", "newset", "--plugin", str(path)])
    assert res.exit_code == 2 and "policy: unknown name 'newset'" in res.output and "did you mean" in res.output


def test_a_detached_driver_and_a_ray_job_get_the_submit_plugins(tmp_path):
    from kdeval.cli.detach import detached_driver_command, ray_job_spec

    path = write_newest(tmp_path / "p")
    entry, _ = detached_driver_command("run-1", None, None, plugins=[str(path), "mypkg.policies"])
    assert entry[-4:] == ["--plugin", str(path.resolve()), "--plugin", "mypkg.policies"]
    grid = _grid(tmp_path)
    cmd, env = ray_job_spec(grid, None, None, plugins=[str(path), "mypkg.policies"])
    assert cmd.endswith("--address auto --plugin my_newest.py --plugin mypkg.policies")
    staged = sorted(p.name for p in Path(env["working_dir"]).iterdir())
    shutil.rmtree(env["working_dir"])
    assert staged == ["grid.yaml", "my_newest.py"]  # the file travels in the job's working_dir
