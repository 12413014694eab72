"""Load and validate a grid file: YAML (safe_load) -> unknown-key check -> pydantic -> the engine's own rules
for the engine settings (budgets, chunk sizes, ``engine:``) -> registry checks.

Every problem is collected into one :class:`GridError` whose issues name the field path
(``policies[2].params.window: must be > 0``) and the expected form, with "did you mean" for typos.

Bounds that hold for every grid, whatever the field (:func:`_bound_issues`): a file of at most
:data:`MAX_GRID_BYTES` whose aliases expand to at most :data:`~kdeval.jobs.grid.size.MAX_GRID_VALUES` values and
whose cells number at most :data:`~kdeval.jobs.grid.size.MAX_GRID_CELLS`; every number finite and within the index's 32-bit integer columns
(:data:`MAX_GRID_INT`); no NUL or other control character but tab and newline in any text (PostgreSQL
cannot store a NUL). Names and per-field ranges are the schema's (:mod:`kdeval.jobs.grid.schema`).
"""
from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kdeval.cluster import catalog
from kdeval.jobs.grid import checks, fit
from kdeval.jobs.grid.errors import GridError, GridIssue, join_path
from kdeval.jobs.grid.no_effect import no_effect_issues
from kdeval.jobs.grid.quant import kv_quant_issues
from kdeval.jobs.grid.schema import BUDGET_FREE_POLICIES, GridSpec
from kdeval.jobs.grid.size import cells_issue, values_issue
from kdeval.names import suggest

#: The largest grid file accepted (checked before it is read or parsed): the run's row stores the grid's text.
MAX_GRID_BYTES = 1 << 20
#: The largest number a grid may give anywhere: budgets, lengths, seeds, ... land in 32-bit integer columns of
#: the index (PostgreSQL ``integer``) and the Parquet rows.
MAX_GRID_INT = 2**31 - 1
#: A value quoted back in a message is cut to this many characters.
MAX_QUOTED = 80

_FORBIDDEN = {
    "trust_remote_code": "is not accepted in grid files: remote model code never runs from a grid",
}


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(BaseModel class, is_list) of a field annotation, or (None, False)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, tuple) and args:
        inner, _ = _model_of(args[0])
        return inner, True
    if args:  # Optional / Union
        for a in args:
            m, lst = _model_of(a)
            if m is not None:
                return m, lst
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _unknown_keys(raw: Any, cls: type[BaseModel], path: list[str | int]) -> list[GridIssue]:
    """Unknown keys anywhere in ``raw`` (checked against ``cls``), with suggestions."""
    if not isinstance(raw, dict):
        return []
    issues: list[GridIssue] = []
    fields = cls.model_fields
    for key, value in raw.items():
        here = path + [str(key)]
        if key in _FORBIDDEN:
            issues.append(GridIssue(join_path(here), _FORBIDDEN[key]))
        elif key not in fields:
            issues.append(GridIssue(join_path(here), f"unknown field{suggest(key, fields)}; "
                                                     f"expected one of {', '.join(fields)}"))
        else:
            sub, is_list = _model_of(fields[key].annotation)
            if sub is None:
                continue
            if isinstance(value, list):  # a list field, or a field that also takes a list (protocol)
                for i, item in enumerate(value):
                    issues += _unknown_keys(item, sub, here + [i])
            elif not is_list:
                issues += _unknown_keys(value, sub, here)
    return issues


def _quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_QUOTED` characters (a 10 MB name is not echoed back whole)."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else f"{text[:MAX_QUOTED]}… ({len(text)} characters)"


def _bound_issues(raw: Any, path: list[str | int]) -> list[GridIssue]:
    """Numbers that are not finite or beyond :data:`MAX_GRID_INT`, and text with control characters, anywhere
    in ``raw`` (the loaded grid), each at its path."""
    if isinstance(raw, dict):
        return [i for k, v in raw.items() for i in _bound_issues(v, path + [str(k)])]
    if isinstance(raw, list):
        return [i for n, v in enumerate(raw) for i in _bound_issues(v, path + [n])]
    where = join_path(path)
    if isinstance(raw, float) and not math.isfinite(raw):
        return [GridIssue(where, f"must be a finite number, got {raw}")]
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and abs(raw) > MAX_GRID_INT:
        return [GridIssue(where, f"must be at most {MAX_GRID_INT} in size (the index stores 32-bit integers), "
                                 f"got {_quote(raw)}")]
    if isinstance(raw, str) and any(ord(c) < 32 and c not in "\t\n\r" or c == "\x7f" for c in raw):
        return [GridIssue(where, f"must not contain control characters, got {_quote(raw)}")]
    return []


def _union_tag(part: Any) -> bool:
    """Whether a location part names a branch of a union (``ProtocolSpec``, ``list[ProtocolSpec]``), not a field."""
    return isinstance(part, str) and (part[:1].isupper() or part.startswith("list["))


def _pydantic_issues(err: ValidationError) -> list[GridIssue]:
    out, kept = [], []
    wrong_type: dict[tuple, Any] = {}  # union fields whose value is of neither branch's type (so far)
    for e in err.errors():
        if e["type"] == "extra_forbidden":  # reported with a suggestion by _unknown_keys
            kept.append(tuple(p for p in e["loc"] if not _union_tag(p)))
            continue
        if any(_union_tag(p) for p in e["loc"]):  # a field taking one entry or a list of them (protocol)
            loc = tuple(p for p in e["loc"] if not _union_tag(p))
            if e["type"] in ("model_type", "list_type"):  # the branch the value is not of
                wrong_type.setdefault(loc, e.get("input"))
                continue
            e = dict(e, loc=loc)
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "missing":
            msg = "required field is missing"
        elif "input" in e and not isinstance(e["input"], (dict, list)):
            msg = f"{msg} (got {_quote(e['input'])})"
        out.append(GridIssue(join_path(e["loc"]), msg))
        kept.append(tuple(e["loc"]))
    for loc, value in wrong_type.items():
        inner = kept + [w for w in wrong_type if len(w) > len(loc)]  # the entry of a list that is wrong
        if not any(k[:len(loc)] == loc for k in inner):
            out.append(GridIssue(join_path(loc), f"expected a mapping or a list of mappings, got {value!r}"))
    return out


def _names(raw: dict, key: str, field: str) -> list[tuple[int, str, dict]]:
    """(index, name, params) of list entries given as a string or a mapping with a string ``field``."""
    out = []
    items = raw.get(key)
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, str):
                out.append((i, item, {}))
            elif isinstance(item, dict) and isinstance(item.get(field), str):
                params = item.get("params")
                out.append((i, item[field], params if isinstance(params, dict) else {}))
    return out


def _registry_issues(raw: dict) -> list[GridIssue]:
    """Unknown model/policy/task names and bad policy params (checked on the raw mapping, so they are
    reported even when other fields fail schema validation)."""
    issues: list[GridIssue] = []
    for i, name, _ in _names(raw, "models", "id"):
        entry = raw["models"][i]
        revision = entry.get("revision") if isinstance(entry, dict) else None
        issues += checks.check_model(i, name, revision if isinstance(revision, str) else None)
    for i, name, params in _names(raw, "policies", "name"):
        issues += checks.check_policy(i, name, params)
    for i, name, params in _names(raw, "tasks", "name"):
        issues += checks.check_task(i, name, params)
    return issues


#: The engine settings a grid gives: (grid path, the engine's setting, the type its values have in the grid).
ENGINE_SETTINGS = (("budgets", "budget", int), ("chunk_sizes", "chunk_size", int),
                   ("engine.score_precision", "score_precision", str))


def _engine_issues(raw: dict) -> list[GridIssue]:
    """The engine's own rules (``kdeval.keydiff.config.RULES``) on the values the grid gives its settings, each
    broken one reported at its grid path (``chunk_sizes[1]: must be a positive number of tokens, got 0``).

    Values of another type are left to pydantic (and a budget that is not an integer to the grid's parsing)."""
    issues: list[GridIssue] = []
    for path, setting, kind in ENGINE_SETTINGS:
        *section, key = path.split(".")
        where = raw.get(section[0]) if section else raw
        if not isinstance(where, dict) or key not in where:
            continue
        value = where[key]
        entries = [(f"{path}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(path, value)]
        for at, v in entries:
            if isinstance(v, kind) and not isinstance(v, bool):
                msg = catalog.engine_setting_error(setting, v)
                if msg is not None:
                    issues.append(GridIssue(at, msg))
    return issues


def _semantic_issues(grid: GridSpec) -> list[GridIssue]:
    issues: list[GridIssue] = []
    if any(p.name not in BUDGET_FREE_POLICIES for p in grid.policies) and not grid.budgets:
        issues.append(GridIssue("budgets", "required when a policy other than 'full' is listed (a list of "
                                           "positive token counts or shares of the prompt, e.g. [256, 512, 25%])"))
    for i, p in enumerate(grid.policies):
        if p.name not in BUDGET_FREE_POLICIES:
            issues += checks.check_budgets(i, p.name, dict(p.params), grid.budgets)
    for compress in dict.fromkeys(p.compress for p in grid.protocols):
        issues += checks.check_protocol(compress, [t.name for t in grid.tasks],
                                        [(p.name, dict(p.params)) for p in grid.policies])
    if any(p.compress == "generated" and p.decode != "evict" for p in grid.protocols):
        issues.append(GridIssue("protocol.decode", "keep under compress: generated evicts nothing (the "
                                "prompt is kept, and so would every generated token be); use decode: evict"))
    issues += checks.check_conversation(grid.conversation, [t.name for t in grid.tasks])
    for m, model in enumerate(grid.models):
        if (grid.generation.batch_size or 1) > 1 and model.attn_implementation != "sdpa":
            issues.append(GridIssue("generation.batch_size", f"a batch of requests runs on SDPA with a padding mask; "
                                    f"models[{m}] uses '{model.attn_implementation}' (set batch_size: 1 or "
                                    f"attn_implementation: sdpa)"))
        for i, p in enumerate(grid.policies):
            why = catalog.policy_attention_error(p.name, dict(p.params), model.attn_implementation)
            if why is not None:
                issues.append(GridIssue(f"models[{m}].attn_implementation",
                                        f"policies[{i}] '{p.name}' {why}; use attn_implementation: sdpa for it"))
    issues += fit.fit_issues(grid, fit.shapes(grid))  # what each model's config says it takes (no weights)
    issues += no_effect_issues(grid)  # settings whose cells would repeat others
    res = grid.resources
    if grid.engine.cuda_graphs and res.gpus_per_worker <= 0:
        issues.append(GridIssue("engine.cuda_graphs", "true needs GPU workers (resources.gpus_per_worker > 0); "
                                                      "leave it null to use graphs wherever CUDA is present"))
    if res.gpus_per_worker > 1:
        issues.append(GridIssue("resources.gpus_per_worker",
                                f"at most 1: the engine runs a model on one device (its CUDA graphs and memory "
                                f"figures are per device), got {res.gpus_per_worker:g}"))
    if res.accelerator_type and res.gpus_per_worker <= 0:
        issues.append(GridIssue("resources.gpus_per_worker",
                                f"must be > 0 when accelerator_type is set (got {res.gpus_per_worker})"))
    seen: set[tuple[str, str]] = set()
    for i, p in enumerate(grid.policies):
        key = (p.name, repr(sorted(p.params.items())))
        if key in seen:
            issues.append(GridIssue(f"policies[{i}]", f"duplicate of an earlier entry for '{p.name}'"))
        seen.add(key)
    return issues


def load_mapping(text: str, source: str | None = None) -> dict:
    """Grid YAML text as its top-level mapping; raises :class:`GridError` on bad YAML, a non-mapping or text of
    more than :data:`MAX_GRID_BYTES`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRID_BYTES:
        raise GridError([_too_big(size)], source)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise GridError([GridIssue("", f"not valid YAML: {where}{getattr(e, 'problem', None) or e}")], source)
    if not isinstance(raw, dict):
        raise GridError([GridIssue("", "expected a mapping at the top level (models:, policies:, budgets:, "
                                       f"chunk_sizes:, tasks: ...), got {type(raw).__name__}")], source)
    return raw


def validate_mapping(raw: dict, source: str | None = None) -> GridSpec:
    """Validate a grid's loaded top-level mapping; raises :class:`GridError` listing every problem.

    Sizes first (:mod:`kdeval.jobs.grid.size`): a mapping whose YAML aliases expand beyond bounds is refused
    before anything walks it, a grid of too many cells before any cell (or task instance) is built."""
    too_big = values_issue(raw)
    if too_big is not None:
        raise GridError([too_big], source)
    bounds = _bound_issues(raw, [])
    if bounds:  # what is out of bounds is not shown to the schema (pydantic would echo it, or take 1e23 as an int)
        raise GridError(_unknown_keys(raw, GridSpec, []) + bounds, source)
    issues = _unknown_keys(raw, GridSpec, [])
    try:
        grid = GridSpec.model_validate(raw)
    except ValidationError as e:
        raise GridError(issues + _pydantic_issues(e) + _engine_issues(raw) + kv_quant_issues(raw)
                        + _registry_issues(raw), source) from None
    too_many = cells_issue(grid)
    if too_many is not None:
        raise GridError([too_many], source)
    engine = _engine_issues(raw) + kv_quant_issues(raw)
    issues += engine + _registry_issues(raw)
    if not engine:  # the policies' budget checks need valid budgets
        issues += _semantic_issues(grid)
    if issues:
        raise GridError(issues, source)
    return grid


def parse_grid(text: str, source: str | None = None) -> GridSpec:
    """Validate grid YAML text; raises :class:`GridError` listing every problem."""
    return validate_mapping(load_mapping(text, source), source)


def _too_big(size: int) -> GridIssue:
    return GridIssue("", f"the grid is {size} bytes; at most {MAX_GRID_BYTES} bytes (1 MiB) are accepted")


def load_grid(path: str | Path) -> tuple[GridSpec, str]:
    """Read and validate a grid file; returns the spec and its text. Raises :class:`GridError`."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_GRID_BYTES:  # before reading it
            raise GridError([_too_big(size)], str(path))
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GridError([GridIssue("", f"cannot read grid file: {e}")], str(path)) from None
    return parse_grid(text, str(path)), text
