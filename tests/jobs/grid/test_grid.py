"""Grid schema, cell expansion and cell identity."""
from __future__ import annotations

import pytest

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid

BASE = """
name: g
models: [random:llama-tiny, {id: random:qwen2-tiny, dtype: bfloat16}]
policies: [full, keydiff, {name: keydiff-sw, params: {window_fraction: 0.5}}]
budgets: [64, 128, 256]
chunk_sizes: [32, 64]
tasks:
  - {name: needle, lengths: [256, 512], samples: 2, seeds: [0, 1]}
resources: {workers: 2}
"""


def test_expansion_counts_and_full_is_budget_independent():
    cells = expand(parse_grid(BASE))
    # per model x chunk x (2 lengths x 2 seeds): full once + 2 policies x 3 budgets
    assert len(cells) == 2 * 2 * 4 * (1 + 2 * 3)
    full = [c for c in cells if c.policy == "full"]
    assert len(full) == 2 * 2 * 4 and all(c.budget is None for c in full)
    assert len({c.id for c in cells}) == len(cells)
    assert {c.model.dtype for c in cells if c.model.id == "random:qwen2-tiny"} == {"bfloat16"}


def test_cell_ids_depend_on_results_inputs_only():
    ids = {c.id for c in expand(parse_grid(BASE))}
    # name, resources and retries do not change any cell
    same = BASE.replace("name: g", "name: other").replace("workers: 2", "workers: 7") + "retries: {max_attempts: 9}\n"
    assert {c.id for c in expand(parse_grid(same))} == ids
    # everything that changes a result does
    for old, new in [("budgets: [64, 128, 256]", "budgets: [64, 128, 257]"),
                     ("window_fraction: 0.5", "window_fraction: 0.4"),
                     ("seeds: [0, 1]", "seeds: [0, 2]"),
                     ("samples: 2", "samples: 3"),
                     ("dtype: bfloat16", "dtype: float16")]:
        changed = {c.id for c in expand(parse_grid(BASE.replace(old, new)))}
        assert changed != ids, old
    g = parse_grid(BASE)
    assert {c.id for c in expand(g, version="9.9")}.isdisjoint(ids)  # kdeval version is part of the id
    gen = {c.id for c in expand(parse_grid(BASE + "generation: {max_new_tokens: 7}\n"))}
    assert gen.isdisjoint(ids)


def test_engine_options_enter_evicting_cells_only():
    plain = expand(parse_grid(BASE))
    fused = expand(parse_grid(BASE + "engine: {score_precision: float32}\n"))
    by_policy = lambda cells, name: {c.id for c in cells if c.policy == name}  # noqa: E731
    assert by_policy(fused, "full") == by_policy(plain, "full")  # full never evicts: one cell serves both
    assert by_policy(fused, "keydiff").isdisjoint(by_policy(plain, "keydiff"))
    kd = next(c for c in fused if c.policy == "keydiff")
    assert kd.to_task().engine == {"score_precision": "float32"} and kd.describe().endswith(" score_precision=float32")
    assert next(c for c in plain if c.policy == "keydiff").to_task().engine == {}


def test_shorthands_and_defaults():
    g = parse_grid("models: [stub:0]\npolicies: [full]\nchunk_sizes: [8]\ntasks: [needle]\n")
    assert g.models[0].id == "stub:0" and g.tasks[0].samples == 8 and g.retries.max_attempts == 3
    assert len(expand(g)) == 1


@pytest.mark.parametrize("text, expected", [
    ("models: [", "not valid YAML"),
    ("- a\n- b", "expected a mapping at the top level"),
    (BASE.replace("budgets:", "budgts:"), "budgts: unknown field (did you mean 'budgets'?)"),
    (BASE.replace("[full, keydiff,", "[full, keydif,"), "policies[1].name: unknown policy 'keydif' (did you mean 'keydiff'?)"),
    (BASE.replace("keydiff-sw, params: {window_fraction: 0.5}", "snapkv, params: {window: 0}"), "policies[2].params.window: must be > 0"),
    (BASE.replace("window_fraction: 0.5", "window_fraction: 2.0"), "policies[2].params.window_fraction: must be in [0, 1)"),
    (BASE.replace("window_fraction: 0.5", "windw_fraction: 0.5"), "policies[2].params.windw_fraction: unknown parameter for policy 'keydiff-sw' (did you mean 'window_fraction'?)"),
    (BASE.replace("[64, 128, 256]", "[64, -1]"), "budgets[1]: must be a positive number of tokens, got -1"),
    (BASE.replace("chunk_sizes: [32, 64]", "chunk_sizes: [0, 64]"), "chunk_sizes[0]: must be a positive number of tokens, got 0"),
    (BASE.replace("chunk_sizes: [32, 64]", "chunk_sizes: [32, 32]"), "chunk_sizes: values must be distinct"),
    (BASE.replace("chunk_sizes: [32, 64]", "chunk_sizes: [32, abc]"), "chunk_sizes[1]: expected a positive number of tokens or 'whole'"),
    (BASE.replace("random:llama-tiny", "random:llama-tyni"), "models[0].id: unknown random model 'random:llama-tyni' (did you mean 'random:llama-tiny'?)"),
    (BASE.replace("dtype: bfloat16", "dtype: fp8"), "models[1].dtype: Input should be 'auto', 'float32', 'float16' or 'bfloat16'"),
    (BASE.replace("dtype: bfloat16", "trust_remote_code: true"), "models[1].trust_remote_code: is not accepted in grid files"),
    (BASE.replace("samples: 2", "samples: 0"), "tasks[0].samples: Input should be greater than or equal to 1"),
    (BASE.replace("lengths: [256, 512]", "lenghts: [256]"), "tasks[0].lenghts: unknown field (did you mean 'lengths'?)"),
    (BASE.replace("workers: 2", "workers: 0"), "resources.workers: Input should be greater than or equal to 1"),
    (BASE + "resources: {accelerator_type: A100}\n", "resources.gpus_per_worker: must be > 0 when accelerator_type is set"),
    (BASE + "engine: {cuda_graph: true}\n", "engine.cuda_graph: unknown field (did you mean 'cuda_graphs'?)"),
    (BASE + "engine: {fuse_layers: true}\n", "engine.fuse_layers: unknown field; expected one of cuda_graphs, "
                                              "score_precision"),
    (BASE + "engine: {cuda_graphs: maybe}\n", "engine.cuda_graphs: Input should be a valid boolean"),
    (BASE + "engine: {cuda_graphs: true}\n", "engine.cuda_graphs: true needs GPU workers"),
    (BASE + "engine: {score_precision: fp16}\n", "engine.score_precision: expected one of ['model', 'float32'], got 'fp16'"),
    (BASE + "engine: {score_precision: 16}\n", "engine.score_precision: Input should be a valid string"),
    # the engine's test hooks (and the keywords they replaced) are no grid options
    (BASE + "engine: {cache_layer: gather}\n", "engine.cache_layer: unknown field; expected one of cuda_graphs, "
                                               "score_precision"),
    (BASE + "engine: {graph_runner: eager}\n", "engine.graph_runner: unknown field; expected one of cuda_graphs, "
                                               "score_precision"),
    (BASE + "engine: {store: gather}\n", "engine.store: unknown field; expected one of cuda_graphs, score_precision"),
    (BASE + "engine: {emulate_graphs: true}\n", "engine.emulate_graphs: unknown field (did you mean 'cuda_graphs'?); "
                                                "expected one of cuda_graphs, score_precision"),
    (BASE.replace("budgets: [64, 128, 256]\n", ""), "budgets: required when a policy other than 'full' is listed"),
    (BASE.replace("chunk_sizes: [32, 64]\n", ""), "chunk_sizes: required field is missing"),
    ("models: [stub:x]\npolicies: [full]\nchunk_sizes: [8]\ntasks: [needle]\n", "models[0].id: expected 'stub:<seconds per cell>'"),
])
def test_malformed_grids_name_the_field(text, expected):
    with pytest.raises(GridError) as info:
        parse_grid(text, "grid.yaml")
    assert expected in str(info.value), str(info.value)
    assert str(info.value).startswith("invalid grid in grid.yaml")


@pytest.mark.parametrize("engine", ["{cache_layer: gather}", "{graph_runner: eager}", "{store: gather}",
                                    "{emulate_graphs: true}"])
def test_the_engines_test_keywords_are_one_grid_error(engine):
    """The reference store and emulated graphs are test hooks of Engine, not grid options: one issue."""
    with pytest.raises(GridError) as info:
        parse_grid(BASE + f"engine: {engine}\n", "grid.yaml")
    [issue] = info.value.issues
    assert issue.path == f"engine.{engine[1:].split(':')[0]}" and issue.message.startswith("unknown field")


@pytest.mark.parametrize("text, expected", [
    (BASE.replace("samples: 2,", "samples: 2, params: {depth: [50]},"), "tasks[0].params.depth: unknown parameter for task 'needle' (did you mean 'depths'?)"),
    (BASE.replace("samples: 2,", "samples: 2, params: {seed: 3},"), "tasks[0].params.seed: set it with tasks[0].seeds"),
    (BASE.replace("name: needle", "name: neddle"), "tasks[0].name: unknown task 'neddle' (did you mean 'needle'?)"),
    (BASE + "generation: {temperature: 0.7}\n", "generation.temperature: unknown field; expected one of max_new_tokens"),
])
def test_task_and_generation_errors(text, expected):
    with pytest.raises(GridError) as info:
        parse_grid(text)
    assert expected in str(info.value), str(info.value)


def test_every_grid_engine_option_is_one_the_worker_takes():
    """A grid's ``engine:`` options reach ``RunSettings(engine=...)`` on a worker, which refuses unknown ones: a
    field here that EngineConfig lacks would pass validation and fail every cell."""
    from kdeval.evals.task_run.settings import engine_options
    from kdeval.jobs.grid.schema import EngineSpec

    assert set(EngineSpec.model_fields) <= set(engine_options())


def test_models_default_to_their_own_dtype_and_one_gpu_per_worker():
    cells = expand(parse_grid(BASE))
    assert {c.model.dtype for c in cells if c.model.id == "random:llama-tiny"} == {"auto"}
    with pytest.raises(GridError) as e:
        parse_grid(BASE + "resources: {gpus_per_worker: 2}\n")
    assert "resources.gpus_per_worker: at most 1: the engine runs a model on one device" in str(e.value)
