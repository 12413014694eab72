"""The grid file schema (pydantic) — what ``kdeval submit grid.yaml`` accepts.

Example (see ``examples/*.yaml``)::

    name: smoke
    models:
      - random:llama-tiny                      # shorthand for {id: random:llama-tiny}
      - {id: smollm2-135m, dtype: float32, attn_implementation: sdpa, revision: null}
    policies:
      - full                                   # budget-independent: one cell per model x chunk x task
      - {name: keydiff}
      - {name: sink, params: {n_sink_tokens: 4}}
    budgets: [256, 512, 25%]                   # tokens kept per layer and KV head, or a share of each prompt
    chunk_sizes: [64, whole]                   # whole: one chunk of all that is compressed (one-shot)
    tasks:
      - {name: needle, lengths: [1024], samples: 4, seeds: [0]}
    generation: {max_new_tokens: null, thinking: keep}  # null: each task's official length; strip: drop <think>
    protocol: {compress: prompt, decode: evict} # query-aware (the paper's); {compress: context}: query-agnostic
                                               # (kvpress's default); a list runs each
    conversation: {mode: multi-turn, answers: golden}  # tasks with several questions per context (turns.*):
                                               # multi-turn or multi-request; a list runs each
    engine: {cuda_graphs: null, score_precision: model}
    kv_quant: [none, 4]                        # how kept tokens are stored: none (full width) or bits / a mapping
    resources: {workers: 2, cpus_per_worker: 1, gpus_per_worker: 0, accelerator_type: null}
    retries: {max_attempts: 3, cell_timeout_s: null}
    execution: {share: true, time_first: true} # false: every cell alone; time_first false: no sample timed alone

Only identity-free settings (resources, retries, execution, name) may change without changing cell ids.
Validation errors are :class:`kdeval.jobs.grid.errors.GridError`; see :func:`kdeval.jobs.grid.load.load_grid`.
"""
from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationInfo, field_validator,
)

from kdeval.evals.task_run.budget import parse_budget
from kdeval.evals.task_run.chunking import parse_chunk
from kdeval.jobs.grid.quant import KVQuantEntry
from kdeval.shown import first_hidden

DType = Literal["auto", "float32", "float16", "bfloat16"]
AttnImpl = Literal["sdpa", "eager", "flash_attention_2"]


def _budget_entry(value: Any) -> Any:
    """A ``budgets`` entry: an int as it is (the list's own check wants it positive), anything else parsed
    as a budget (``"25%"`` -> its canonical text; ValueError naming what is expected)."""
    return value if type(value) is int else parse_budget(value)


def _printable(value: str) -> str:
    """A name without control characters (NUL, newlines, escapes): the index and every table hold it as one line;
    nor bidi controls or invisible characters (U+202E, U+2066, U+200B), which would reorder or hide what a
    terminal shows around it."""
    bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"must not contain control characters (found {bad!r})")
    hid = first_hidden(value)
    if hid is not None:
        raise ValueError(f"must not contain bidi or invisible characters (found '{hid}')")
    return value


def Name(max_length: int) -> Any:
    """A name of at most ``max_length`` characters (the width of its index column), printable."""
    return Annotated[str, Field(min_length=1, max_length=max_length), AfterValidator(_printable)]


#: A grid budget: N tokens, or a share of each sample's prompt as its canonical text (``"25%"``; see
#: :mod:`kdeval.evals.task_run.budget`), resolved per sample by the runner.
BudgetValue = Annotated[int | str, BeforeValidator(_budget_entry)]

#: A grid chunk size: B tokens (the engine's rule checks the range) or ``"whole"`` (:mod:`kdeval.evals.task_run.chunking`).
ChunkValue = Annotated[int | str, BeforeValidator(parse_chunk)]

#: Policies whose result does not depend on the budget (one cell serves every budget).
BUDGET_FREE_POLICIES = frozenset({"full"})


class _Strict(BaseModel):
    """Unknown keys are errors (typos must not silently fall back to defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """A model: a known name (``smollm2-135m``, ``random:llama-tiny``), a hub id or a local path.

    ``stub:<seconds>`` names a model-free stub workload of that cost per cell (cluster smoke tests and
    the scheduler benchmark).

    Remote code never runs: every model, config and tokenizer loads with ``trust_remote_code=False``, and a
    grid cannot turn it on (a ``trust_remote_code`` key is refused), so only architectures transformers ships
    run and no command asks on stdin whether to run a model's own code. A local directory is read as untrusted
    input at submit, before any weight loads: its ``config.json`` (regular file, at most 4 MiB, nesting of 64,
    every size, layer and head count a positive integer within bounds, heads that divide, finite numbers, a
    family ``kdeval models`` lists), its tokenizer files and its safetensors headers (weights whole); a config
    whose ``auto_map`` names code of its own for an architecture transformers does not ship is refused. Each
    refusal is one line naming the file and the field.
    """

    id: Name(300) = Field(description="A known name (`smollm2-135m`, `gemma3-270m`, `qwen2.5-coder-0.5b`, "
                          "`random:llama-tiny`; every `random:<family>-tiny` that `kdeval models` lists), a hub id "
                          "or a local path of a decoder-only model.")
    dtype: DType = Field("auto", description="Weights' dtype; `auto` is the model's own dtype on a GPU and "
                         "float32 on a CPU.")
    attn_implementation: AttnImpl = Field("sdpa", description="transformers' attention implementation; "
                                          "`flash_attention_2` needs the optional `flash` extra.")
    revision: Name(200) | None = Field(None, description="A hub revision (branch, tag or commit) to pin.")


class PolicySpec(_Strict):
    """An eviction policy by registry name and its parameters (validated by the policy itself)."""

    name: Name(100) = Field(description="A registered policy name (`kdeval policies`).")
    params: dict[str, Any] = Field(default_factory=dict, description="The policy's parameters; unset ones take "
                                   "the policy's defaults, unknown ones are errors.")


class TaskSpec(_Strict):
    """A task: registry name, prompt lengths (synthetic tasks), samples per cell, seeds."""

    name: Name(200) = Field(description="A registered task name (`kdeval tasks`).")
    lengths: list[int] | None = Field(default=None, min_length=1, description="Prompt lengths in tokens, each "
                                      "its own cell; null for tasks with natural lengths (datasets).")
    samples: int = Field(default=8, ge=1, le=100_000, description="Samples per cell (a task with fewer runs "
                         "what it has, and says so).")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Seeds passed to the task, "
                             "each its own cell (they vary generated samples).")
    params: dict[str, Any] = Field(default_factory=dict, description="The task's parameters (`source: hub`, "
                                   "needle `depths`, ...): see the task reference.")

    @field_validator("lengths")
    @classmethod
    def _positive_lengths(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(x < 1 for x in v):
            raise ValueError("every length must be >= 1 token")
        return v


class GenerationSpec(_Strict):
    """Decoding settings shared by all cells. Decoding is greedy. ``max_new_tokens`` bounds every task's
    generation; None = each task's official length (LongBench's per-task table, RULER's, ...). ``batch_size``:
    samples sent through the engine together; results do not depend on it, so it is not part of a cell's id.
    None = chosen per worker from measurement (``kdeval.cluster.execute.default_batch_size``). ``thinking``:
    ``keep`` scores the whole output; ``strip`` scores what follows a reasoning model's thinking block
    (``kdeval.evals.tasks.thinking``); part of a cell's id only when set to ``strip``."""

    max_new_tokens: int | None = Field(default=None, ge=1, le=1_000_000, description="Bounds every task's "
                                       "generation; null: each task's official length.")
    batch_size: int | None = Field(default=None, ge=1, le=1024, description="Samples sent through the engine "
                                   "together; not part of a cell's id. null: chosen per worker.")
    thinking: Literal["keep", "strip"] = Field("keep", description="`keep` scores the whole output; `strip` "
                                               "scores what follows a reasoning model's thinking block.")


class ProtocolSpec(_Strict):
    """What the budget applies to (part of a cell's identity).

    ``compress``: ``prompt`` (the KeyDiff paper: every chunk of the whole prompt, question included, is
    compressed) or ``context`` (kvpress: only the context is compressed, chunk by chunk; the question is then
    processed without evicting it). ``decode``: ``evict`` (eviction continues after every generated token) or
    ``keep`` (no eviction after the prompt). ``compress: generated`` (R-KV's protocol for reasoning traces)
    keeps the whole prompt and evicts among generated tokens only, to the budget (a share: of
    ``max_new_tokens``); it needs ``decode: evict``.
    """

    compress: Literal["prompt", "context", "generated"] = Field(
        "prompt", description="`prompt` (query-aware): every chunk of the whole prompt is compressed; "
        "`context` (query-agnostic): only the context, the question is never evicted; `generated` "
        "(prompt-kept): the whole prompt is kept, eviction chooses among generated tokens only (reasoning "
        "traces).")
    decode: Literal["evict", "keep"] = Field("evict", description="`evict`: eviction continues after every "
                                             "generated token; `keep`: no eviction after the prompt.")

    @property
    def label(self) -> str:
        """``prompt/evict``, ``context/keep`` ... (the ``protocol`` column of result rows)."""
        return f"{self.compress}/{self.decode}"

    @property
    def name(self) -> str:
        """What kvpress's leaderboard calls it: ``query-aware`` (the question is compressed with the context:
        ``compress: prompt``) or ``query-agnostic`` (``compress: context``)."""
        return COMPRESS_NAMES[self.compress]


class ConversationSpec(_Strict):
    """How a task with several questions per context asks them (``kdeval.evals.task_run.conversation``; part of its cells'
    identity). ``mode``: ``multi-turn`` (SCBench's protocol: the context compressed once, then each turn's
    question fed to the cache the earlier turns left, after the previous answer) or ``multi-request`` (every
    question from the same compressed context, the cache not updated). ``answers``: what a multi-turn turn
    feeds back, ``golden`` (the reference) or ``own`` (the model's answer)."""

    mode: Literal["multi-turn", "multi-request"] = Field("multi-turn", description="`multi-turn`: each question "
                                                         "continues the cache the earlier turns left; "
                                                         "`multi-request`: each from the same compressed context.")
    answers: Literal["golden", "own"] = Field("golden", description="What a multi-turn turn feeds back: the "
                                              "reference answer (`golden`) or the model's own (`own`).")

    @property
    def label(self) -> str:
        """``multi-turn/golden``, ``multi-turn/own`` or ``multi-request`` (the rows' ``conversation``)."""
        return self.mode if self.mode == "multi-request" else f"{self.mode}/{self.answers}"


#: The protocols' names in reports: is the question in what gets compressed?
COMPRESS_NAMES = {"prompt": "query-aware", "context": "query-agnostic", "generated": "prompt-kept"}


class EngineSpec(_Strict):
    """Options of the chunked engine that change a cell's numbers (``kdeval.keydiff.EngineConfig``); part of a
    cell's identity. Speed options that have not been measured to help on a GPU are not grid options (they live
    behind ``bench/``'s experimental switch until a GPU run decides their fate).

    ``cuda_graphs``: capture the chunk and decode steps as CUDA graphs (rounding-level differences on a GPU);
    ``null`` = on with CUDA, ``true`` needs GPU workers. ``score_precision``: the attention logits TOVA, SnapKV
    and H2O score with in a half-precision model, ``model`` (its own precision, float32 softmax) or ``float32``.
    """

    cuda_graphs: bool | None = Field(None, description="Capture the chunk and decode steps as CUDA graphs; "
                                     "null: on wherever CUDA is; `true` needs GPU workers.")
    # its allowed values are the engine's (kdeval.jobs.grid.load checks them)
    score_precision: str = Field("model", description="Attention logits of TOVA, SnapKV and H2O in a "
                                 "half-precision model: `model` (its own precision) or `float32`.")

    def options(self) -> dict[str, Any]:
        """The non-default options (what a cell's description and the worker's engine take)."""
        return {k: v for k, v in self.model_dump().items() if v != type(self).model_fields[k].default}


class ResourceSpec(_Strict):
    """Workers: how many, and what each holds (GPUs pinned by Ray's ``accelerator_type``)."""

    workers: int = Field(default=1, ge=1, le=4096, description="Ray worker actors, each holding one loaded "
                         "model across cells.")
    shard_size: int = Field(default=32, ge=1, le=100_000, description="Samples per unit of work the scheduler "
                            "hands out (fewer when the grid's groups are fewer units of work than its workers, to "
                            "spread them); a killed worker loses at most one shard. Changes no result.")
    cpus_per_worker: float = Field(default=1.0, gt=0, le=1024, description="CPUs each worker reserves (more "
                                   "than a node has and Ray would wait forever).")
    gpus_per_worker: float = Field(default=0.0, ge=0, description="GPUs each worker holds: 0 (CPU workers) or "
                                   "1; more is refused.")
    accelerator_type: Name(100) | None = Field(None, description="Ray's accelerator type workers are pinned to "
                                               "(`A100`, `H100`, ...).")


class RetrySpec(_Strict):
    """Attempt caps and an optional per-cell time limit."""

    max_attempts: int = Field(default=3, ge=1, le=100, description="Attempts per unit of work before its cell "
                              "is marked failed.")
    cell_timeout_s: float | None = Field(default=None, gt=0, le=30 * 86400, description="Seconds a shard may "
                                         "run before its worker is replaced and the attempt counts as failed (at "
                                         "most 30 days); null: no limit.")


class ExecutionSpec(_Strict):
    """How cells are computed, never what they compute (not part of a cell's id): ``share`` runs the cells that
    can share (same model, task instance, samples and generation length) as groups that compute what they
    have alike once (``kdeval.jobs.run.groups``); ``false`` runs every cell alone (debugging, equality checks)."""

    share: StrictBool = Field(True, description="Run the cells that can share (same model, task, samples and "
                              "generation length) as groups computing what they have alike once; `false`: every "
                              "cell alone. Changes no result.")
    time_first: StrictBool = Field(True, description="In a group, run each cell's first samples alone so that "
                                   "they carry the cell's timings (TTFT, process peak); `false`: share every "
                                   "sample (accuracy-only grids, faster: rows carry no TTFT and reports say "
                                   "so). Changes no result but timings.")


class GridSpec(_Strict):
    """A whole grid file."""

    name: Name(200) = Field("grid", description="The grid's name (runs and reports show it; not part of a "
                            "cell's id).")
    models: list[ModelSpec] = Field(min_length=1, description="Models; a bare string is the model's `id`.")
    policies: list[PolicySpec] = Field(min_length=1, description="Policies; a bare string is the policy's `name`.")
    budgets: list[BudgetValue] = Field(default_factory=list, description="N: tokens kept per full-attention layer and KV "
                                       "head (a model's sliding-window or chunked layers keep their window: "
                                       "`kdeval models`), or a share of each prompt (`25%`). Each value once; may "
                                       "be empty when every policy is `full`.")
    chunk_sizes: list[ChunkValue] = Field(min_length=1, description="B: prompt tokens per chunk, or `whole` "
                                          "(one chunk of all that is compressed: one-shot). Each value once.")
    tasks: list[TaskSpec] = Field(min_length=1, description="Tasks; a bare string is the task's `name`.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="Decoding settings of every "
                                       "cell.")
    protocol: ProtocolSpec | list[ProtocolSpec] = Field(default_factory=ProtocolSpec, description="What the "
                                                        "budget applies to; a list runs each.")
    conversation: ConversationSpec | list[ConversationSpec] | None = Field(
        None, description="How tasks with several questions per context (`turns.*`, `scbench.*`) ask them; a list "
        "runs each. null: multi-turn with golden answers. Only for such tasks.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Engine options that change results.")
    kv_quant: list[KVQuantEntry] = Field(default_factory=lambda: [None], min_length=1, description="How kept "
                                         "tokens are stored, one cell per entry: `none` (the model's width), a "
                                         "number of bits, or {bits, group_size, window, scheme} "
                                         "(kdeval.jobs.grid.quant).")
    resources: ResourceSpec = Field(default_factory=ResourceSpec, description="Workers and what each holds.")
    retries: RetrySpec = Field(default_factory=RetrySpec, description="Attempt caps and time limits.")
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec, description="How cells are computed "
                                     "(shared or alone); not part of a cell's id.")

    @field_validator("models", "policies", "tasks", mode="before")
    @classmethod
    def _shorthand(cls, v: Any, info: ValidationInfo) -> Any:
        """A bare string in these lists is the entry's ``id`` (models) or ``name`` (policies, tasks)."""
        key = "id" if info.field_name == "models" else "name"
        if isinstance(v, list):
            return [{key: x} if isinstance(x, str) else x for x in v]
        return v

    @property
    def protocols(self) -> list[ProtocolSpec]:
        """``protocol`` as a list (a grid may give one protocol or several; each cell runs one)."""
        return list(self.protocol) if isinstance(self.protocol, list) else [self.protocol]

    @property
    def conversations(self) -> list[ConversationSpec]:
        """``conversation`` as a list (the default multi-turn one when unset): what a multi-question task runs."""
        if self.conversation is None:
            return [ConversationSpec()]
        return list(self.conversation) if isinstance(self.conversation, list) else [self.conversation]

    @field_validator("conversation")
    @classmethod
    def _conversations(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("a list of conversations must name at least one, each once")
        return v

    @field_validator("protocol")
    @classmethod
    def _protocols(cls, v: ProtocolSpec | list[ProtocolSpec]) -> ProtocolSpec | list[ProtocolSpec]:
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("a list of protocols must name at least one, each once")
        return v

    @field_validator("budgets", "chunk_sizes")
    @classmethod
    def _distinct(cls, v: list[int | str]) -> list[int | str]:
        """Each value once (a token budget's range is the engine's rule: :func:`kdeval.jobs.grid.load.validate_mapping`;
        shares were checked by ``parse_budget`` and are canonical text: "25.0%" repeats "25%")."""
        if len(set(v)) != len(v):
            raise ValueError("values must be distinct")
        return v
