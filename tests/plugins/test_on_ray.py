"""Plugins on a local Ray: a plugin file in a folder no worker has on its path reaches the workers through Ray's
runtime environment; its cells run, an unchanged plugin reuses them, an edited one computes them anew; a resume
without the plugin, or with an edited one, is one line."""
from __future__ import annotations

import pytest

from kdeval.cluster import plugins
from kdeval.cluster.plugin_env import shipped_modules, upload_modules

from .helpers import write_newest


@pytest.fixture(autouse=True)
def _forget_plugins():
    yield
    for module in list(plugins._LOADED):
        plugins._unload(module)


def grid(name: str) -> dict:
    return {"name": name, "models": ["random:llama-tiny"], "policies": ["newest"], "budgets": [32],
            "chunk_sizes": [16], "generation": {"max_new_tokens": 2},
            "tasks": [{"name": "needle", "lengths": [512], "samples": 1, "params": {"haystack": "noise"}}]}


def _shipped_file(specs):
    """On a worker started with the plugins' runtime environment: where the plugin was imported from."""
    import sys

    from kdeval.baselines import policy_names
    from kdeval.cluster.plugins import ensure

    ensure(specs)
    return sys.modules[specs[0].module].__file__, "newest" in policy_names()


def test_a_worker_imports_the_shipped_copy_not_the_local_file(local_ray, tmp_path):
    path = write_newest(tmp_path / "not-on-any-path", module="shipped_newest")
    spec = plugins.load_plugin(str(path)).spec
    env = {"py_modules": list(upload_modules(shipped_modules([spec])))}
    task = local_ray.remote(num_cpus=0, runtime_env=env)(_shipped_file)
    where, registered = local_ray.get(task.remote([spec]), timeout=120)
    assert registered and where != str(path) and where.endswith("shipped_newest.py")
    bare = local_ray.remote(num_cpus=0)(_shipped_file)  # without the runtime environment it is not there
    with pytest.raises(Exception, match="no such module"):
        local_ray.get(bare.remote([spec]), timeout=120)


def test_run_grid_with_a_plugin_runs_reuses_and_recomputes_after_an_edit(local_ray, tmp_path, monkeypatch):
    from kdeval.api import run_grid
    from kdeval.cluster.plugins import PluginError
    from kdeval.jobs.run import service
    from kdeval.storage import RunIndex

    monkeypatch.chdir(tmp_path)
    path = write_newest(tmp_path / "plugins", module="grid_newest")
    df = run_grid(grid("plugin"), plugins=[path])
    assert df.attrs["failed"] == {} and set(df["policy"]) == {"newest"} and len(df) == 1
    first = df["cell_id"].iloc[0]
    again = run_grid(grid("plugin"), plugins=[path])
    assert again.attrs["reused"] == 1 and again["cell_id"].iloc[0] == first
    write_newest(tmp_path / "plugins", module="grid_newest", tail=" * 1.0")  # an edit: other code, a new cell
    edited = run_grid(grid("plugin"), plugins=[path])
    assert edited.attrs["reused"] == 0 and edited.attrs["failed"] == {} and edited["cell_id"].iloc[0] != first

    # a run whose plugin this process no longer has, or has in another version, is refused in one line
    index = RunIndex.open(None)
    try:
        run_id = edited.attrs["run_id"]
        cells = [service._stored_spec(v, run_id) for v in index.run_cells(run_id)]
        write_newest(tmp_path / "plugins", module="grid_newest", tail=" * 2.0")
        plugins.load_plugin(str(path))
        with pytest.raises(PluginError, match=f"run {run_id}: policy 'newest' \\(plugin file grid_newest.py\\) "
                                              "changed since the run was submitted"):
            service.run_plugins(run_id, cells)
        plugins._unload("grid_newest")
        with pytest.raises(PluginError, match=f"run {run_id}: policy 'newest' is registered by no plugin here; "
                                              "give its plugin with --plugin"):
            service.run_plugins(run_id, cells)
    finally:
        index.close()
