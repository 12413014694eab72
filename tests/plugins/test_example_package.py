"""examples/plugin installed as a user installs it (pip, into a temporary target on PYTHONPATH): its entry point
registers `newest`, which `kdeval policies` lists with its package and version; its own test passes;
`check-policy` holds on it; a grid naming it runs on a local Ray, reuses its cells when nothing changed, and
computes them anew once the installed policy is edited. In this process, on a Ray whose workers lack the
package, the check at submit names the node that cannot import it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdeval.cluster import plugins

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(EXAMPLE)], check=True, timeout=300, cwd=build,
                   capture_output=True)
    return target


def kdeval(installed: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kdeval.cli.app", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_the_installed_entry_point_is_listed_and_its_own_test_passes(installed, tmp_path):
    res = kdeval(installed, "policies", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    newest = next(p for p in json.loads(res.stdout) if p["name"] == "newest")
    assert newest["origin"] == "entry point kdeval.policies:newest (kdeval-newest-plugin 0.1.0)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)])}
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "--rootdir", str(EXAMPLE), str(EXAMPLE / "tests")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert test.returncode == 0 and "2 passed" in test.stdout, test.stdout + test.stderr


def test_check_policy_holds_on_the_installed_policy(installed, tmp_path):
    res = kdeval(installed, "check-policy", "newest", "--family", "llama", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0] == ("check-policy newest (entry point kdeval.policies:newest "
                                          "(kdeval-newest-plugin 0.1.0)): 6 checks on 1 families")


def test_a_grid_over_it_runs_reuses_and_recomputes_after_an_edit(installed, tmp_path):
    args = ("submit", str(EXAMPLE / "grid.yaml"), "--db", str(tmp_path / "index.sqlite"), "--results-dir",
            str(tmp_path / "results"))
    first = kdeval(installed, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 cells, 0 already done, 3 to run" in first.stdout
    again = kdeval(installed, *args, cwd=tmp_path)
    assert again.returncode == 0 and "3 cells, 3 already done, 0 to run" in again.stdout, again.stdout
    policy = installed / "kdeval_newest" / "policy.py"
    policy.write_text(policy.read_text().replace("return ctx.positions.float()", "return ctx.positions.double()"))
    edited = kdeval(installed, *args, cwd=tmp_path)
    assert edited.returncode == 0, edited.stdout + edited.stderr
    assert "3 cells, 1 already done, 2 to run" in edited.stdout  # full is reused, both newest cells recomputed


def test_the_submit_check_names_a_node_that_cannot_import_an_installed_plugin(installed, local_ray, monkeypatch):
    """This test's Ray workers do not have the temporary target on their path, so the package is missing there."""
    monkeypatch.syspath_prepend(str(installed))
    try:
        loaded = plugins.load_entry_points()
        spec = next(p.spec for p in loaded if "newest" in p.policies)
        assert spec.ship is None  # installed: not shipped, checked
        from kdeval.cluster.plugin_env import check_nodes

        with pytest.raises(plugins.PluginError, match=r"plugin kdeval.policies:newest: node \w{12} \(127\.0\.0\.1\) "
                                                      r"cannot import it: entry point kdeval.policies:newest: not "
                                                      r"installed here"):
            check_nodes([spec])
    finally:
        for module in list(plugins._LOADED):
            plugins._unload(module)
