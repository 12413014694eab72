"""Cells: a grid expanded into model × policy × budget × chunk × task runs, with content-hash ids.

A cell's id is the sha256 of the canonical JSON of exactly what changes its result: the model (id, revision,
dtype, attention implementation), the policy and its parameters, budget, chunk size, protocol, the task (name,
length, seed, parameters, the ids of the samples it runs, a digest of the data it reads and where that comes
from, its generation length), generation and engine settings, and the version of the code that computes
results (``kdeval.version.result_code_hash``: the engine, this policy's own modules, the tasks and metrics, the
cell execution). Nothing else enters it: not the grid name, resources or retry limits, nor the CLI, scheduler,
storage or report code. A budget is N tokens (an int, hashed as before) or a share of each prompt (its
canonical text, ``"25%"``: a different cell from any N). ``full`` keeps every token, so its cells carry
``budget=None`` and the default engine options and protocol (which only matter to evicting policies): one
cell serves every budget, engine setting and protocol.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from kdeval import __version__
from kdeval.cluster import catalog, plugins
from kdeval.cluster.execute import build_eval_task
from kdeval.cluster.stub import STUB_PREFIX
from kdeval.cluster.workload import CellTask, model_key
from kdeval.evals import get_spec
from kdeval.evals.task_run.budget import budget_share, budget_tokens
from kdeval.evals.task_run.chunking import chunk_code, chunk_text
from kdeval.evals.tasks.base import EvalError
from kdeval.evals.tasks.identity import task_data
from kdeval.jobs.grid import fit
from kdeval.jobs.grid.checks import share_budget_notes
from kdeval.jobs.grid.errors import GridError, GridIssue
from kdeval.jobs.grid.no_effect import window_notes
from kdeval.jobs.grid.quant import KVQuantSpec
from kdeval.jobs.grid.schema import (
    BUDGET_FREE_POLICIES, COMPRESS_NAMES, ConversationSpec, EngineSpec, ExecutionSpec, GenerationSpec, GridSpec,
    ModelSpec, ProtocolSpec,
)
from kdeval.storage import CellRecord
from kdeval.version import code_version, result_code_hash


def policy_label(name: str, params: dict[str, Any]) -> str:
    """``name``, or ``name(k=v,...)`` with the parameters in key order (cell descriptions, report rows); a
    wrapped policy (``{name, params}`` as a value) reads the same way: ``ada(inner=snapkv(pooling=avg))``."""
    def value(v: Any) -> Any:
        return policy_label(v["name"], v.get("params") or {}) if isinstance(v, dict) and "name" in v else v

    return f"{name}(" + ",".join(f"{k}={value(params[k])}" for k in sorted(params)) + ")" if params else name


def protocol_parts(spec: dict[str, Any] | None, conversation: bool = True) -> list[str]:
    """The words of :func:`protocol_tag` (``["query-agnostic", "decode keep"]``; none for the defaults)."""
    p = (spec or {}).get("protocol") or {}
    parts = [COMPRESS_NAMES[p["compress"]]] if p.get("compress", "prompt") != "prompt" else []
    parts += [f"decode {p['decode']}"] if p.get("decode", "evict") != "evict" else []
    parts += [store_label(spec)] if store_label(spec) else []
    c = ((spec or {}).get("conversation") or {}) if conversation else {}
    parts += ["multi-request"] if c.get("mode") == "multi-request" else []
    parts += ["own answers"] if c.get("answers") == "own" else []
    return parts


def protocol_tag(spec: dict[str, Any] | None, conversation: bool = True) -> str:
    """What a policy label gets for a protocol other than the default query-aware one with decode eviction,
    for a quantized store (``" [kivi-4b-g32-w128]"``) and for a conversation other than multi-turn with golden
    answers (``spec``: a cell's spec as stored): ``" [query-agnostic]"``, ``" [decode keep]"``,
    ``" [multi-request]"``, ``" [own answers]"``, ... ("" for the defaults), so the cells of a run holding several
    stay apart in reports, status and progress. ``conversation=False``: the protocol and store only (reports mark
    the conversation on the task instead)."""
    parts = protocol_parts(spec, conversation)
    return f" [{', '.join(parts)}]" if parts else ""


def conversation_tag(spec: dict[str, Any] | None) -> str:
    """What a task instance label gets in reports for a conversation other than multi-turn with golden answers:
    ``" [multi-request]"``, ``" [own answers]"`` or ""."""
    c = (spec or {}).get("conversation") or {}
    if c.get("mode") == "multi-request":
        return " [multi-request]"
    return " [own answers]" if c.get("answers") == "own" else ""


def store_label(spec: dict[str, Any] | None) -> str:
    """The KV store of a cell (``spec``: its spec as stored): its ``kv_quant`` label, "" at the model's width."""
    quant = (spec or {}).get("kv_quant")
    return KVQuantSpec(**quant).label if quant else ""


#: Stored in a cell's spec but not hashed into its id: results are the same whatever their value.
NOT_IDENTITY = {"generation": {"batch_size"}}
#: Hashed into a cell's id only when not at this default, so that cells written before the field existed keep
#: their ids (``generation.thinking``: ``keep`` scores as every earlier cell did).
HASHED_WHEN_SET = {"generation": {"thinking": "keep"}}


def _content_hash(model: BaseModel, exclude: dict | None = None) -> str:
    """sha256 (hex) of a model's canonical JSON: every field but ``exclude``, keys sorted, no whitespace."""
    canon = json.dumps(model.model_dump(mode="json", exclude=exclude), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


class TaskRef(BaseModel):
    """One task instance of a cell: ``length`` is None for tasks with natural lengths.

    ``samples`` is how many samples the cell runs (the grid's count, or fewer when the task has fewer);
    ``sample_ids_digest`` hashes their ids (``hub`` when they are only known once hub data is fetched);
    ``data_digest`` / ``data_source`` come from :func:`kdeval.evals.tasks.identity.task_data`; ``max_new_tokens`` is
    the generation length the cell uses (the grid's or the task's official one).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    length: int | None
    samples: int
    seed: int
    params: dict[str, Any] = {}
    sample_ids_digest: str = ""
    data_digest: str = ""
    data_source: str = ""
    max_new_tokens: int | None = None

    @property
    def label(self) -> str:
        """Short readable label, e.g. ``needle@1024#s0``."""
        length = f"@{self.length}" if self.length is not None else ""
        return f"{self.name}{length}#s{self.seed}"


class CellSpec(BaseModel):
    """Everything a worker needs to run one cell (JSON-able; this is what is hashed into the id).

    ``kdeval_version`` is not the package's version: it is the release plus the hash of the code that computes
    this cell's result (``kdeval.version.result_code_hash``), which differs between cells of other policies."""

    model_config = ConfigDict(frozen=True)

    model: ModelSpec
    policy: str
    policy_params: dict[str, Any] = {}
    budget: int | str | None  # N tokens, a share such as "25%" (kdeval.evals.task_run.budget), None for ``full``
    chunk_size: int | str  # B tokens, or "whole" (one chunk: kdeval.evals.task_run.chunking; the index stores 0)
    task: TaskRef
    generation: GenerationSpec
    protocol: ProtocolSpec = ProtocolSpec()
    engine: EngineSpec = EngineSpec()
    #: how a task with several questions per context asks them; None for one-question tasks (not hashed then,
    #: so their cells keep the ids they had before conversations existed)
    conversation: ConversationSpec | None = None
    #: how kept tokens are stored (None: at the model's width; then not hashed, so earlier cells keep their ids)
    kv_quant: KVQuantSpec | None = None
    kdeval_version: str
    #: Not part of what computes the result: a namespace (e.g. one nightly's, or its environment's) that gives
    #: the same result identity a new storage id, so it is computed afresh beside, never over, earlier results.
    salt: str | None = None

    @property
    def result_id(self) -> str:
        """Content hash (24 hex digits) of the spec, less the settings results do not depend on, those of
        :data:`HASHED_WHEN_SET` at their defaults, and the salt."""
        exclude: dict = {section: set(fields) for section, fields in NOT_IDENTITY.items()}
        for section, defaults in HASHED_WHEN_SET.items():
            part = getattr(self, section)
            exclude.setdefault(section, set()).update(k for k, v in defaults.items() if getattr(part, k) == v)
        exclude["salt"] = True
        if self.conversation is None:
            exclude["conversation"] = True
        if self.kv_quant is None:
            exclude["kv_quant"] = True
        return _content_hash(self, exclude=exclude)[:24]

    @property
    def id(self) -> str:
        """The cell's storage id: :attr:`result_id`, or with a salt the hash of both (a new id per salt)."""
        if self.salt is None:
            return self.result_id
        return hashlib.sha256(f"{self.result_id}/{self.salt}".encode()).hexdigest()[:24]

    @property
    def model_key(self) -> str:
        """What a worker must have loaded to run this cell (same key = no reload; = ``to_task().model_key``)."""
        m = self.model
        return model_key(m.id, m.revision, m.dtype, m.attn_implementation)

    def to_task(self) -> CellTask:
        """The worker-side description of this cell."""
        m, t = self.model, self.task
        return CellTask(
            cell_id=self.id, model_id=m.id, dtype=m.dtype, attn_implementation=m.attn_implementation,
            revision=m.revision, policy=self.policy, policy_params=dict(self.policy_params),
            budget=self.budget, chunk_size=self.chunk_size, task=t.name, length=t.length,
            samples=t.samples, seed=t.seed, task_params=dict(t.params),
            max_new_tokens=generation_length(self.generation, t.name), batch_size=self.generation.batch_size,
            thinking=self.generation.thinking, engine=self.engine_options(),
            compress=self.protocol.compress, decode=self.protocol.decode,
            conversation=None if self.conversation is None else self.conversation.model_dump(),
        )

    def engine_options(self) -> dict[str, Any]:
        """The engine's options for this cell: the grid's non-default ``engine:`` ones and its ``kv_quant``."""
        quant = {"kv_quant": self.kv_quant.model_dump()} if self.kv_quant is not None else {}
        return {**self.engine.options(), **quant}

    def record(self) -> CellRecord:
        """The row the index stores for this cell."""
        return CellRecord(id=self.id, spec=self.model_dump(mode="json"), model=self.model.id,
                          policy=self.policy, budget=budget_tokens(self.budget),
                          budget_share=budget_share(self.budget), chunk_size=chunk_code(self.chunk_size),
                          task=self.task.label)

    def describe(self) -> str:
        """One line for dry runs and logs."""
        budget = "-" if self.budget is None else str(self.budget)
        pol = policy_label(self.policy, self.policy_params)
        engine = "".join(f" {k}={v}" for k, v in self.engine.options().items())
        proto = "" if self.protocol == ProtocolSpec() else f" protocol={self.protocol.label}"
        proto += " thinking=strip" if self.generation.thinking == "strip" else ""
        proto += f" conversation={self.conversation.label}" if self.conversation is not None else ""
        proto += f" kv_quant={self.kv_quant.label}" if self.kv_quant is not None else ""
        return (f"{self.model.id} {pol} N={budget} B={chunk_text(self.chunk_size)} {self.task.label}"
                f" n={self.task.samples}"
                f" gen={self.task.max_new_tokens}{proto}{engine}")


def kdeval_version() -> str:
    """The running package's version, release + hash of every source file (runs and provenance record it)."""
    return code_version()


def cell_code_version(policy: str, params: dict[str, Any] | None = None, stub: bool = False) -> str:
    """Release + hash of the code that computes a cell of ``policy`` with ``params`` (see ``kdeval.version``);
    ``stub``: the cell's model is a ``stub:`` workload."""
    plugin = catalog.policy_plugin_digest(policy, params)  # outside the cache: an edited plugin is new code
    return _code_version(policy, json.dumps(params or {}, sort_keys=True, default=str), stub, plugin)


@lru_cache(maxsize=None)
def _code_version(policy: str, params_json: str, stub: bool, plugin: str = "") -> str:
    files = catalog.policy_source_files(policy, json.loads(params_json))
    code = result_code_hash(files, catalog.every_policy_source_file(), stub=stub)
    if plugin:  # a plugin policy: its own source and version join the engine's code (kdeval.cluster.plugins)
        code = hashlib.sha256(f"{code}+{plugin}".encode()).hexdigest()[:12]
    return f"{__version__}+{code}"


@dataclass(frozen=True)
class Expansion:
    """A grid's cells and what the user should know about them (e.g. fewer samples than asked for)."""

    cells: list[CellSpec]
    notes: list[str]


def _task_refs(grid: GridSpec) -> tuple[dict[tuple[int, int | None, int], TaskRef], list[str]]:
    """The :class:`TaskRef` of every (task index, length, seed); raises :class:`GridError` naming the task when
    its data cannot be read."""
    refs: dict[tuple[int, int | None, int], TaskRef] = {}
    notes: list[str] = []
    issues: list[GridIssue] = []
    for i, spec in enumerate(grid.tasks):
        max_new = generation_length(grid.generation, spec.name)
        for length, seed in product(spec.lengths or [None], spec.seeds):
            try:
                task = build_eval_task(spec.name, dict(spec.params), length=length, seed=seed,
                                       samples=spec.samples, max_new_tokens=max_new)
                data = task_data(task, spec.samples, max_new)
            except (EvalError, OSError) as e:
                issues.append(GridIssue(f"tasks[{i}]", f"{spec.name}: {e}"))
                break
            n = spec.samples if data.sample_ids is None else len(data.sample_ids)
            if data.available is not None and data.available < spec.samples:
                at = f" at length {length}" if length is not None else ""
                notes.append(f"tasks[{i}].samples: {spec.name}{at} has {data.available} samples "
                             f"({_what_samples(spec.name, spec.params)}); the cell runs {n}, not {spec.samples}")
            ids = "hub" if data.sample_ids is None else hashlib.sha256("\n".join(data.sample_ids).encode()).hexdigest()[:16]
            digest = data.digest
            metric = plugins.metric_plugin(str(spec.params.get("metric", "")))
            if metric is not None:  # a plugin's metric scores the cell: its code is part of what the cell computes
                digest = hashlib.sha256(f"{digest}+{metric.digest}".encode()).hexdigest()[:16]
            refs[(i, length, seed)] = TaskRef(name=spec.name, length=length, samples=n, seed=seed,
                                              params=dict(spec.params), sample_ids_digest=ids,
                                              data_digest=digest, data_source=data.source,
                                              max_new_tokens=data.generation_length)
    if issues:
        raise GridError(issues)
    return refs, notes


def generation_length(generation: GenerationSpec, task: str) -> int | None:
    """The length a cell of ``task`` generates when the grid sets it (None: the task's own): the grid's
    ``max_new_tokens``, else, under ``thinking: strip``, the task's length for reasoning models (MATH-500, AIME)."""
    if generation.max_new_tokens is not None or generation.thinking != "strip":
        return generation.max_new_tokens
    return get_spec(task).cls.reasoning_max_new_tokens


def _what_samples(name: str, params: dict[str, Any]) -> str:
    if name == "needle":
        return f"one per depth of params.depths {params.get('depths', 'default: 0, 25, 50, 75, 100')}"
    if name == "phonebook":
        return "num_books × questions_per_book per length"
    if name in ("infinitebench.passkey", "infinitebench.number_string", "infinitebench.kv_retrieval"):
        return "one per depth of params.depths (default: 0, 25, 50, 75, 100) × params.repeats per length"
    return "every sample of its data"


def expand_grid(grid: GridSpec, version: str | None = None, salt: Callable[[CellSpec], str] | None = None
                ) -> Expansion:
    """All distinct cells of a grid in a stable order (model, chunk, task, policy, budget), and notes.

    ``version``: the code version every cell records (tests); None = each policy's :func:`cell_code_version`.
    ``salt``: each cell's :attr:`CellSpec.salt` (None: unsalted, as ``submit`` runs them).
    """
    refs, notes = _task_refs(grid)
    model_shapes = fit.shapes(grid)  # what validation checked the settings against (kdeval.jobs.grid.fit)
    notes += fit.quant_notes(grid, model_shapes) + window_notes(grid, model_shapes)
    lengths = [(i, t.name, max(t.lengths)) for i, t in enumerate(grid.tasks) if t.lengths]
    for i, pol in enumerate(grid.policies):
        if pol.name not in BUDGET_FREE_POLICIES:
            notes += share_budget_notes(i, pol.name, dict(pol.params), grid.budgets, lengths)
    cells: dict[str, CellSpec] = {}
    for (model, shape), chunk, (i, task) in product(zip(grid.models, model_shapes), grid.chunk_sizes,
                                                    enumerate(grid.tasks)):
        for length, seed in product(task.lengths or [None], task.seeds):
            ref = refs[(i, length, seed)]
            several = get_spec(task.name).cls.multi_question
            for pol, conv in product(grid.policies, grid.conversations if several else [None]):
                free = pol.name in BUDGET_FREE_POLICIES  # never evicts: no budget, engine options or protocol
                for budget, protocol, quant in product([None] if free else grid.budgets,
                                                       [ProtocolSpec()] if free else grid.protocols, grid.kv_quant):
                    quant = fit.resolved_quant(quant, shape)  # an unset group: from the model's head_dim
                    cell = CellSpec(model=model, policy=pol.name, policy_params=dict(pol.params),
                                    budget=budget, chunk_size=chunk, task=ref, generation=grid.generation,
                                    protocol=protocol, conversation=conv, kv_quant=quant,
                                    engine=EngineSpec() if free else grid.engine,
                                    kdeval_version=version or cell_code_version(
                                        pol.name, dict(pol.params), model.id.startswith(STUB_PREFIX)))
                    if salt is not None:
                        cell = cell.model_copy(update={"salt": salt(cell)})
                    cells.setdefault(cell.id, cell)
    return Expansion(list(cells.values()), notes)


def expand(grid: GridSpec, version: str | None = None) -> list[CellSpec]:
    """The cells of :func:`expand_grid`."""
    return expand_grid(grid, version).cells


def grid_hash(grid: GridSpec) -> str:
    """Hash of the validated grid (all fields; ``execution`` only when not at its default, so that grids written
    before it existed keep their hash), to recognise resubmissions."""
    return _content_hash(grid, exclude={"execution"} if grid.execution == ExecutionSpec() else None)
