"""Policies from the user's code: plugins named on the command line (``--plugin FILE_OR_MODULE``), given to
``run_grid(..., plugins=...)``, or registered by an installed package through the entry-point group
``kdeval.policies`` (as pytest plugins are). A grid file never names code: it names the policies plugins register.

A plugin is a Python file or an importable module. What it registers is a :class:`~kdeval.keydiff.policy.
interface.Policy` subclass (a ``@dataclass`` with a ``name``, its parameters validated in ``__post_init__`` /
``validate``, and ``score``), with ``@register`` or simply defined in the module; an entry point names such a
class or a module that registers its policies when imported. Each plugin gets a digest of its source (the file,
or every ``.py`` file of its top-level package) and its distribution's version, which enters the identity of
every cell of its policies (:func:`policy_plugin_digest`): an edit recomputes them, an unchanged plugin reuses
them.

Workers import the plugins a run uses by module name (:func:`ensure`): a file or a module that is not installed
is shipped to them through Ray's runtime environment (``py_modules``, :mod:`kdeval.cluster.plugin_env`), an
installed package must be importable on every node (checked before cells are dispatched).

Bad plugins are one line naming the plugin and what was expected (:class:`PluginError`, a ``ValueError``).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Sequence

from kdeval.cluster.plugin_checks import check_policy_class, probe_policy
from kdeval.cluster.plugin_digests import MAX_SOURCE_BYTES, distribution as _distribution  # noqa: F401
from kdeval.cluster.plugin_digests import module_digest as _module_digest, source_digest
from kdeval.cluster.plugin_types import Plugin, PluginError, PluginSpec, one_line as _one_line  # noqa: F401

#: the entry-point groups of installed policy and metric plugins
POLICY_GROUP = "kdeval.policies"
METRIC_GROUP = "kdeval.metrics"


_LOADED: dict[str, Plugin] = {}  # module name -> plugin
_POLICY_OWNER: dict[str, str] = {}  # policy name -> module name of its plugin
_METRICS: dict[str, PluginSpec] = {}  # metric name -> the entry point's spec


def loaded() -> list[Plugin]:
    """The plugins loaded into this process, in load order."""
    return list(_LOADED.values())


def policy_plugin(name: str) -> Plugin | None:
    """The plugin that registered policy ``name``, or None for a built-in (or unknown) one."""
    owner = _POLICY_OWNER.get(name)
    return None if owner is None else _LOADED.get(owner)


def policy_origin(name: str) -> str:
    """``built-in`` or where plugin policy ``name`` came from (``plugin file mypolicies.py``)."""
    plugin = policy_plugin(name)
    return "built-in" if plugin is None else plugin.spec.origin


def policy_plugin_digest(names: Iterable[str]) -> str:
    """The digests of the code outside kdeval of policies ``names`` (a cell's policy and the one it wraps),
    joined: a plugin's :attr:`PluginSpec.digest`, or for a class registered in the process by hand (a notebook's)
    the digest of its class's source; "" when every one is built-in (:mod:`kdeval.version` hashes their code)."""
    from kdeval.keydiff.policy.registry import registered

    digests = set()
    table = registered()
    for name in names:
        plugin = policy_plugin(name)
        if plugin is not None:
            digests.add(plugin.spec.digest)
        elif name in table and not table[name].__module__.startswith("kdeval."):
            digests.add(_class_digest(table[name]))
    return "+".join(sorted(digests))


def _class_digest(cls: type) -> str:
    """sha256 (16 hex digits) of a hand-registered policy class's source (its name when it has none)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        source = f"{cls.__module__}.{cls.__qualname__}"
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def plugins_for(policies: Iterable[str]) -> list[PluginSpec]:
    """The specs of the plugins that registered ``policies`` (what a run's workers must import)."""
    out: dict[str, PluginSpec] = {}
    for name in policies:
        plugin = policy_plugin(name)
        if plugin is not None:
            out[plugin.spec.module] = plugin.spec
    return list(out.values())


# --- loading ---------------------------------------------------------------------------------------------------


def _registry() -> Any:
    import kdeval.baselines  # noqa: F401 - every built-in policy registered first: a plugin cannot take a name
    from kdeval.keydiff.policy import registry

    return registry


def _is_file_ref(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or "\\" in ref or Path(ref).is_file()


def load_plugin(ref: str) -> Plugin:
    """Import the plugin ``ref`` (a ``.py`` file or an importable module) and register its policies; a plugin
    already loaded with the same source is kept, one whose source changed is loaded again. Raises
    :class:`PluginError`."""
    if _is_file_ref(ref):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise PluginError(f"plugin {ref}: no such file (expected a .py file or an importable module name)")
        if path.suffix != ".py" or not path.stem.isidentifier():
            raise PluginError(f"plugin {ref}: expected a .py file whose name is a Python identifier")
        path = path.resolve()
        digest = source_digest(path.parent, [path], None, ref)
        spec = PluginSpec("file", str(path), path.stem, digest, ship=str(path))
        taken = sys.modules.get(path.stem)
        if taken is not None and path.stem not in _LOADED:
            where = getattr(taken, "__file__", None) or "built in"
            raise PluginError(f"plugin {ref}: its module name '{path.stem}' is already taken by {where}; "
                              "rename the file")
        return _load(spec, lambda: _import_file(path))
    if not all(part.isidentifier() for part in ref.split(".")):
        raise PluginError(f"plugin {ref}: expected a .py file or an importable module name")
    return _load_module(ref, "module", ref)


def _load_module(module_name: str, kind: str, ref: str, obj: Any = None, probe: bool = True) -> Plugin:
    """A plugin given by module name (``kind`` module or entry point); ``obj``: an entry point's object."""
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as e:
        raise PluginError(f"plugin {ref}: cannot be imported: {type(e).__name__}: {e}") from None
    if found is None:
        raise PluginError(f"plugin {ref}: no such module (expected a .py file or an importable module name)")
    dist = _distribution(module_name)
    version = f"{dist.metadata['Name']} {dist.version}" if dist is not None else None
    top_spec = importlib.util.find_spec(module_name.split(".")[0])
    locations = list(top_spec.submodule_search_locations or [])
    if locations:  # a package: every .py file of its top-level folder is its code
        root = Path(locations[0]).resolve()
        files, ship = sorted(root.rglob("*.py")), str(root)
    else:
        origin = Path(top_spec.origin).resolve()
        root, files, ship = origin.parent, [origin], str(origin)
    digest = source_digest(root, files, version, ref)  # before importing: a changed source is loaded again
    if dist is not None or kind != "module":
        ship = None  # installed: importable on every node already (checked there before cells run)
    spec = PluginSpec(kind, ref, module_name, digest, ship=ship, version=version)
    return _load(spec, lambda: _import_module(module_name, ref), obj, probe)


def _import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(path.stem, None)
        raise
    return module


def _import_module(name: str, ref: str) -> ModuleType:
    return importlib.import_module(name)


def _unload(module_name: str) -> None:
    """Forget a loaded plugin: its policies leave the table, its modules leave ``sys.modules``."""
    plugin = _LOADED.pop(module_name, None)
    if plugin is None:
        return
    registry = _registry()
    for name in plugin.policies:
        registry.unregister(name)
        _POLICY_OWNER.pop(name, None)
    top = module_name.split(".")[0]
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _load(spec: PluginSpec, do_import, obj: Any = None, probe: bool = True) -> Plugin:
    """Import a plugin (again when its digest changed), register what it defines, check its policies."""
    have = _LOADED.get(spec.module)
    if have is not None and have.spec.digest == spec.digest:
        return have
    if have is not None:
        _unload(spec.module)
    elif spec.kind != "file":
        for name in [m for m in sys.modules if m == spec.module.split(".")[0] or m.startswith(spec.module + ".")]:
            del sys.modules[name]  # imported before as a plain module: import it afresh to see what it registers
    registry = _registry()
    before = registry.registered()
    try:
        module = do_import()
        if spec.kind == "entry point" and obj is None:
            obj = module
    except PluginError:
        raise
    except ValueError as e:  # @register's "registered twice": a name taken by a built-in or another plugin
        _rollback(registry, before)
        raise PluginError(f"plugin {spec.ref}: {_collision(str(e))}") from None
    except BaseException as e:  # noqa: BLE001 - any error the user's code raises at import
        _rollback(registry, before)
        raise PluginError(f"plugin {spec.ref}: import failed: {type(e).__name__}: {_one_line(e)}") from None
    try:
        names = _register_defined(registry, module, before, spec, obj)
        if not names:
            raise PluginError(f"plugin {spec.ref}: defines no policy (expected a @dataclass subclass of "
                              "kdeval.keydiff.policy.interface.Policy with a name and a score method)")
        for name in names:
            check_policy_class(registry.registered()[name], spec.ref)
            if probe:
                probe_policy(registry.registered()[name], spec.ref)
    except PluginError:
        _rollback(registry, before)
        sys.modules.pop(spec.module, None)
        raise
    plugin = Plugin(spec, tuple(names))
    _LOADED[spec.module] = plugin
    for name in names:
        _POLICY_OWNER[name] = spec.module
    return plugin


def _collision(message: str) -> str:
    if "registered twice" in message:
        name = message.split("'")[1] if "'" in message else "?"
        return f"policy name '{name}' is already taken by the {policy_origin(name)} policy; rename it"
    return _one_line(ValueError(message))


def _rollback(registry: Any, before: dict[str, Any]) -> None:
    for name in set(registry.registered()) - set(before):
        registry.unregister(name)


def _register_defined(registry: Any, module: ModuleType, before: dict[str, Any], spec: PluginSpec,
                      obj: Any) -> list[str]:
    """Names the import registered, plus the policy classes the module (or the entry point's ``obj``) defines
    without ``@register``; a name already taken is refused."""
    from kdeval.keydiff.policy.interface import Policy

    if obj is not None and not isinstance(obj, ModuleType):
        if not (inspect.isclass(obj) and issubclass(obj, Policy)):
            raise PluginError(f"plugin {spec.ref}: expected a Policy subclass or a module that defines policies, "
                              f"got {type(obj).__name__} {getattr(obj, '__name__', obj)!r}")
        candidates = [obj]
    else:
        source = obj if isinstance(obj, ModuleType) else module
        candidates = [c for _, c in inspect.getmembers(source, inspect.isclass)
                      if issubclass(c, Policy) and c.__module__.startswith(source.__name__) and "name" in c.__dict__]
    table = registry.registered()
    for cls in candidates:
        if table.get(cls.name) is cls:
            continue
        if cls.name in table:
            raise PluginError(f"plugin {spec.ref}: {_collision(f'policy name {cls.name!r} is registered twice')}")
        registry.register(cls)
        table[cls.name] = cls
    return sorted(n for n in registry.registered() if n not in before)


def load_entry_points(group: str = POLICY_GROUP) -> list[Plugin]:
    """Load every installed plugin of entry-point ``group``."""
    out = []
    for ep in importlib.metadata.entry_points(group=group):
        ref = f"{group}:{ep.name}"
        try:
            obj = ep.load()
        except BaseException as e:  # noqa: BLE001 - the plugin's own import
            raise PluginError(f"entry point {ref} ({ep.value}): import failed: {type(e).__name__}: "
                              f"{_one_line(e)}") from None
        module_name = ep.module
        if module_name in _LOADED:
            out.append(_LOADED[module_name])
            continue
        plugin = _adopt_loaded(module_name, ref, obj)
        out.append(plugin)
    return out


def _adopt_loaded(module_name: str, ref: str, obj: Any, probe: bool = True) -> Plugin:
    """An entry point's module, already imported by ``ep.load()``: what it registered is read from the
    classes it defines (a ``@register`` at import ran before the snapshot could be taken)."""
    registry = _registry()
    module = sys.modules[module_name]
    dist = _distribution(module_name)
    version = f"{dist.metadata['Name']} {dist.version}" if dist is not None else None
    spec = PluginSpec("entry point", ref, module_name, _module_digest(module, ref, version), version=version)
    from kdeval.keydiff.policy.interface import Policy

    source = obj if obj is not None else module
    classes = [source] if inspect.isclass(source) else [
        c for _, c in inspect.getmembers(source, inspect.isclass)
        if issubclass(c, Policy) and c.__module__.startswith(module_name.split(".")[0]) and "name" in c.__dict__]
    if not (isinstance(source, ModuleType) or (inspect.isclass(source) and issubclass(source, Policy))):
        raise PluginError(f"entry point {ref}: expected a Policy subclass or a module that defines policies, "
                          f"got {type(source).__name__}")
    names = []
    table = registry.registered()
    for cls in classes:
        if table.get(cls.name) not in (None, cls):
            raise PluginError(f"entry point {ref}: {_collision(f'policy name {cls.name!r} is registered twice')}")
        if cls.name not in table:
            registry.register(cls)
        check_policy_class(cls, ref)
        if probe:
            probe_policy(cls, ref)
        names.append(cls.name)
    if not names:
        raise PluginError(f"entry point {ref}: defines no policy")
    plugin = Plugin(spec, tuple(sorted(names)))
    _LOADED[module_name] = plugin
    for name in names:
        _POLICY_OWNER[name] = module_name
    return plugin


def load_metric_entry_points() -> list[PluginSpec]:
    """Register every installed metric of entry-point group ``kdeval.metrics``: a function ``(prediction,
    references) -> score in [0, 1]`` under the entry point's name, checked on a known answer."""
    from kdeval.evals.metrics.registry import register_metric

    out = []
    for ep in importlib.metadata.entry_points(group=METRIC_GROUP):
        spec = _metric_spec(ep)
        if _METRICS.get(ep.name) == spec:
            out.append(spec)
            continue
        fn = ep.load()
        try:
            value = fn("42", ["42"]) if callable(fn) else None
        except Exception as e:  # noqa: BLE001 - the plugin's own error
            raise PluginError(f"entry point {spec.ref}: its metric failed on ('42', ['42']): {type(e).__name__}: "
                              f"{_one_line(e)}") from None
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise PluginError(f"entry point {spec.ref}: expected a function (prediction, references) -> a score in "
                              f"[0, 1], got {type(fn).__name__} giving {value!r}")
        try:
            register_metric(ep.name, fn, spec.origin)
        except ValueError as e:
            raise PluginError(f"entry point {spec.ref}: {e}") from None
        _METRICS[ep.name] = spec
        out.append(spec)
    return out


def _metric_spec(ep: Any) -> PluginSpec:
    module = importlib.import_module(ep.module)
    dist = _distribution(ep.module)
    version = f"{dist.metadata['Name']} {dist.version}" if dist is not None else None
    ref = f"{METRIC_GROUP}:{ep.name}"
    return PluginSpec("entry point", ref, ep.module, _module_digest(module, ref, version), version=version)


def metric_plugin(name: str) -> PluginSpec | None:
    """The entry point of plugin metric ``name``, or None for a built-in (or unknown) one."""
    return _METRICS.get(name)


def load_plugins(refs: Sequence[str] = (), entry_points: bool = True) -> list[Plugin]:
    """The installed entry-point plugins (``entry_points``: policies and metrics) and then ``refs``, each loaded
    once."""
    if entry_points:
        load_metric_entry_points()
    out = load_entry_points() if entry_points else []
    out += [load_plugin(str(ref)) for ref in refs]
    return out


# --- on a worker -----------------------------------------------------------------------------------------------


def ensure(specs: Sequence[PluginSpec]) -> None:
    """On a worker: import every plugin of ``specs`` by module name (shipped ones are on the path through
    Ray's runtime environment) and check that its digest is the one the driver computed (a plugin edited after
    the cells were identified would compute them with other code). Raises :class:`PluginError`."""
    for spec in specs:
        have = _LOADED.get(spec.module)
        if have is not None and have.spec.digest == spec.digest:
            continue
        if have is not None:
            _unload(spec.module)
        if spec.ref.startswith(f"{METRIC_GROUP}:"):  # a metric: the worker's own installed entry points
            load_metric_entry_points()
            name = spec.ref.partition(":")[2]
            if name not in _METRICS:
                raise PluginError(f"entry point {spec.ref}: not installed here (expected {spec.version or 'it'})")
            if _METRICS[name].digest != spec.digest:
                raise PluginError(f"plugin {spec.ref}: its source here differs from the one the cells were "
                                  "identified with; submit the grid again")
            continue
        if spec.kind == "entry point":
            group, _, name = spec.ref.partition(":")
            eps = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
            if not eps:
                raise PluginError(f"entry point {spec.ref}: not installed here (expected {spec.version or 'it'})")
            plugin = _adopt_loaded(eps[0].module, spec.ref, eps[0].load(), probe=False)
        else:
            plugin = _load_module(spec.module, "module", spec.ref, probe=False)
        if plugin.spec.digest != spec.digest:
            raise PluginError(f"plugin {spec.ref}: its source here differs from the one the cells were "
                              f"identified with (digest {plugin.spec.digest}, expected {spec.digest}); "
                              "submit the grid again")
