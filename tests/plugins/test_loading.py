"""Plugins (kdeval/cluster/plugins.py): a file or module registers its policies with a digest of its source; an
edit loads it again with a new digest (and new cell ids), an unchanged one is kept; a plugin's parameters are
validated like a built-in's; bad plugins are one line naming the plugin and what was expected."""
from __future__ import annotations

import sys
import textwrap

import pytest

from kdeval.baselines import get_policy, policy_names
from kdeval.cluster import plugins
from kdeval.cluster.plugins import PluginError, load_plugin
from kdeval.jobs.grid.cells import cell_code_version

from .helpers import write_newest


@pytest.fixture(autouse=True)
def _forget_plugins():
    yield
    for module in list(plugins._LOADED):
        plugins._unload(module)


def test_a_file_registers_its_policy_with_its_origin_and_validated_params(tmp_path):
    path = write_newest(tmp_path / "p")
    plugin = load_plugin(str(path))
    assert plugin.policies == ("newest",) and plugin.spec.kind == "file" and plugin.spec.ship == str(path)
    assert "newest" in policy_names()
    assert plugins.policy_origin("newest") == "plugin file my_newest.py"
    assert plugins.policy_origin("snapkv") == "built-in"
    assert get_policy("newest", n_sink_tokens="4").n_sink() == 4  # CLI strings coerced as for built-ins
    with pytest.raises(ValueError, match="n_sink_tokens: expected >= 0, got -1"):
        get_policy("newest", n_sink_tokens=-1)
    with pytest.raises(ValueError, match="window: unknown parameter for policy 'newest'"):
        get_policy("newest", window=3)


def test_the_same_file_is_kept_and_an_edit_is_a_new_digest_and_new_cells(tmp_path):
    path = write_newest(tmp_path / "p")
    first = load_plugin(str(path))
    v1 = cell_code_version("newest", {})
    assert load_plugin(str(path)) is first and cell_code_version("newest", {}) == v1  # unchanged: reused
    write_newest(tmp_path / "p", tail=" * 1.0")
    second = load_plugin(str(path))
    assert second.spec.digest != first.spec.digest
    v2 = cell_code_version("newest", {})
    assert v2 != v1 and v2.split("+")[0] == v1.split("+")[0]
    assert cell_code_version("keydiff", {}) == cell_code_version("keydiff", {})  # built-ins untouched
    assert sys.modules["my_newest"].__file__ == str(path)


def test_a_plugin_policy_wrapped_by_a_built_in_wrapper_enters_the_wrapper_cells_identity(tmp_path):
    path = write_newest(tmp_path / "p")
    load_plugin(str(path))
    wrapped = cell_code_version("chunkkv", {"inner": "newest"})
    write_newest(tmp_path / "p", tail=" + 0.0")
    load_plugin(str(path))
    assert cell_code_version("chunkkv", {"inner": "newest"}) != wrapped
    assert cell_code_version("chunkkv", {}) == cell_code_version("chunkkv", {})


def test_a_module_on_the_path_is_a_plugin_shipped_as_its_package(tmp_path, monkeypatch):
    pkg = tmp_path / "lib" / "mypkg"
    write_newest(pkg, module="policies", name="newest-pkg")
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    plugin = load_plugin("mypkg.policies")
    assert plugin.policies == ("newest-pkg",) and plugin.spec.kind == "module"
    assert plugin.spec.ship == str(pkg.resolve())  # not installed: Ray ships the package folder
    (pkg / "helpers.py").write_text("X = 1\n")  # any file of the package is its code
    again = load_plugin("mypkg.policies")
    assert again.spec.digest != plugin.spec.digest


BAD = {
    "import": ("import not_a_module_anywhere\n", "import failed: ModuleNotFoundError: No module named "
                                                  "'not_a_module_anywhere'"),
    "none": ("def score(keys):\n    return keys\n", r"defines no policy \(expected a @dataclass subclass"),
    "collide": (textwrap.dedent('''
        from dataclasses import dataclass
        from kdeval.keydiff.policy.interface import Policy
        from kdeval.keydiff.policy.registry import register

        @register
        @dataclass
        class Mine(Policy):
            name = "snapkv"
            def score(self, keys, ctx):
                return keys.norm(dim=-1)
        '''), "policy name 'snapkv' is already taken by the built-in policy; rename it"),
    "shape": (textwrap.dedent('''
        from dataclasses import dataclass
        from kdeval.keydiff.policy.interface import Policy

        @dataclass
        class Flat(Policy):
            name = "flat"
            def score(self, keys, ctx):
                return keys.norm(dim=-1).mean(dim=1)
        '''), r"policy 'flat': score\(keys \[1, 2, 12, 16\], ctx\) returned Tensor of shape \[1, 12\] float32; "
              r"expected floats of shape \[batch, kv_heads, tokens\] = \[1, 2, 12\]"),
    "defaults": (textwrap.dedent('''
        from dataclasses import dataclass
        from kdeval.keydiff.policy.interface import Policy

        @dataclass
        class Picky(Policy):
            name = "picky"
            window: int = 0
            def validate(self):
                if self.window <= 0:
                    raise ValueError(f"window: expected > 0, got {self.window}")
            def score(self, keys, ctx):
                return keys.norm(dim=-1)
        '''), "policy 'picky': cannot be built at its defaults: window: expected > 0, got 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_plugin_is_one_line_naming_it_and_registers_nothing(tmp_path, case):
    source, message = BAD[case]
    path = tmp_path / f"bad_{case}.py"
    path.write_text(source)
    before = set(policy_names())
    with pytest.raises(PluginError) as e:
        load_plugin(str(path))
    assert str(e.value).startswith(f"plugin {path}: ") and "\n" not in str(e.value)
    import re
    assert re.search(message, str(e.value)), str(e.value)
    assert set(policy_names()) == before and f"bad_{case}" not in sys.modules


def test_a_missing_file_an_odd_name_and_a_taken_module_name_are_refused(tmp_path):
    with pytest.raises(PluginError, match=r"plugin nowhere/x\.py: no such file"):
        load_plugin("nowhere/x.py")
    with pytest.raises(PluginError, match=r"plugin not_a_module_xyz: no such module"):
        load_plugin("not_a_module_xyz")
    taken = write_newest(tmp_path, module="json")
    with pytest.raises(PluginError, match="its module name 'json' is already taken by .*; rename the file"):
        load_plugin(str(taken))
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (plugins.MAX_SOURCE_BYTES + 1))
    with pytest.raises(PluginError, match="expected Python source of at most 4 MiB"):
        load_plugin(str(big))


def test_ensure_imports_by_module_name_and_refuses_another_source(tmp_path, monkeypatch):
    """What a worker does: the shipped copy is on its path; its digest must be the driver's."""
    path = write_newest(tmp_path / "driver")
    spec = load_plugin(str(path)).spec
    plugins._unload(spec.module)
    shipped = write_newest(tmp_path / "worker")  # the same source elsewhere, as Ray unpacks it
    monkeypatch.syspath_prepend(str(shipped.parent))
    plugins.ensure([spec])
    assert "newest" in policy_names() and sys.modules["my_newest"].__file__ == str(shipped.resolve())
    plugins._unload(spec.module)
    write_newest(tmp_path / "worker", tail=" * 2.0")
    with pytest.raises(PluginError, match="its source here differs from the one the cells were identified with"):
        plugins.ensure([spec])
