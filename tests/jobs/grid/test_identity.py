"""Cell identity: exactly what changes a result enters a cell's id (code, data, samples, protocol)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kdeval
from kdeval.jobs.grid.cells import expand, expand_grid
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid

GRID = """
name: ident
models: [random:llama-tiny]
policies: [full, keydiff, {name: snapkv, params: {window: 8}}]
budgets: [64]
chunk_sizes: [32]
tasks:
  - {name: needle, lengths: [400], samples: 2, params: {depths: [25, 75]}}
  - {name: math500, samples: 3}
"""

IDS_SCRIPT = """
import json, sys
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
print(json.dumps({c.policy + "|" + c.task.name: c.id for c in expand(parse_grid(sys.stdin.read()))}))
"""


def _ids(grid: str = GRID) -> dict[str, str]:
    return {c.policy + "|" + c.task.name: c.id for c in expand(parse_grid(grid))}


def _ids_from_copies(pristine: Path, root: Path, edits: dict[str, tuple[str, ...]],
                     data_dir: str) -> dict[str, dict[str, str]]:
    """Per name of ``edits``: the cell ids computed by a copy of ``pristine`` (a copy of the package) whose files
    ``edits[name]`` (package-relative paths) were each given a comment at the end. The copies run at once."""
    running = {}
    for name, files in edits.items():
        dest = root / name
        shutil.copytree(pristine, dest / "kdeval")
        for edit in files:
            target = dest / "kdeval" / edit
            target.write_text(target.read_text() + "\n# an edit that changes nothing\n")
        env = dict(os.environ, PYTHONPATH=str(dest), KDEVAL_DATA_DIR=data_dir)
        (dest / "grid.yaml").write_text(GRID)
        with open(dest / "grid.yaml") as grid:
            running[name] = subprocess.Popen([sys.executable, "-c", IDS_SCRIPT], stdin=grid, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, env=env,
                                             cwd=dest)  # not the checkout: "" leads sys.path
    out = {}
    for name, proc in running.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {stderr[-3000:]}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_code_edits_change_exactly_the_cells_whose_code_changed(tmp_path, data_dir):
    pristine = tmp_path / "pristine"
    shutil.copytree(Path(kdeval.__file__).parent, pristine, ignore=shutil.ignore_patterns("__pycache__"))
    ids = _ids_from_copies(pristine, tmp_path, {
        "base": (),
        # comments in the CLI, the scheduler, storage and reports
        "service": ("cli/app.py", "jobs/run/scheduler.py", "storage/index.py", "jobs/reports/render/html.py"),
        "snap": ("baselines/snapkv.py",),  # one policy's file
        "engine": ("keydiff/engine.py",),  # the engine
        "task": ("evals/benchmarks/needle.py",),  # a task module
    }, str(data_dir))
    base = ids["base"]
    assert len(base) == 6
    assert ids["service"] == base  # no cell changes
    assert {k for k in base if ids["snap"][k] != base[k]} == {"snapkv|needle", "snapkv|math500"}  # no other
    assert all(ids["engine"][k] != base[k] for k in base)  # every cell, full included
    assert all(ids["task"][k] != base[k] for k in base)  # every cell


@pytest.fixture
def data_dir() -> Path:
    root = os.environ.get("KDEVAL_DATA_DIR")
    if not root or not (Path(root) / "math500" / "test.jsonl").is_file():
        pytest.skip("KDEVAL_DATA_DIR with math500/test.jsonl is needed (make test sets it)")
    return Path(root)


def test_a_changed_data_file_changes_the_cells_that_read_it(tmp_path, data_dir, monkeypatch):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(copy))
    base = _ids()
    math = copy / "math500" / "test.jsonl"
    math.write_text(math.read_text().replace("\\frac", "\\dfrac", 1))  # one changed character
    after = _ids()
    assert {k for k in base if after[k] != base[k]} == {"full|math500", "keydiff|math500", "snapkv|math500"}
    # the needle's essays: 'auto' falls back to noise without them, under another id
    (copy / "haystack" / "PaulGrahamEssays.json").unlink()
    noise = _ids()
    assert {k for k in base if noise[k] != after[k]} == {"full|needle", "keydiff|needle", "snapkv|needle"}
    cell = next(c for c in expand(parse_grid(GRID)) if c.task.name == "needle")
    assert cell.task.data_source == "noise haystack (no essay file)"


def test_sample_ids_not_counts_enter_the_id(data_dir):
    # two depths give two samples: asking for 8 runs the same two, so it is the same cell, and the user is told
    asked8 = GRID.replace("samples: 2, params: {depths: [25, 75]}", "samples: 8, params: {depths: [25, 75]}")
    exp = expand_grid(parse_grid(asked8))
    assert {c.id for c in exp.cells} == set(_ids().values())
    assert exp.notes == ["tasks[0].samples: needle at length 400 has 2 samples (one per depth of params.depths "
                         "[25, 75]); the cell runs 2, not 8"]
    # other depths are other samples: other ids, same count
    other = _ids(GRID.replace("depths: [25, 75]", "depths: [25, 50]"))
    assert other["keydiff|needle"] != _ids()["keydiff|needle"]
    assert other["keydiff|math500"] == _ids()["keydiff|math500"]


def test_generation_length_is_the_grids_or_the_tasks_own(data_dir):
    cells = {c.policy + "|" + c.task.name: c for c in expand(parse_grid(GRID))}
    assert cells["keydiff|needle"].task.max_new_tokens == 32  # NeedleTask's default
    assert cells["keydiff|math500"].task.max_new_tokens == 1024
    bounded = expand(parse_grid(GRID + "generation: {max_new_tokens: 8}\n"))
    assert {c.task.max_new_tokens for c in bounded} == {8}
    assert all(c.to_task().max_new_tokens == 8 for c in bounded)
    ruler = expand(parse_grid(GRID.replace("{name: math500, samples: 3}",
                                           "{name: ruler.niah_single_1, lengths: [512], samples: 2}")))
    assert {c.task.max_new_tokens for c in ruler if c.task.name.startswith("ruler")} == {128}


def test_protocol_enters_evicting_cells_only(data_dir):
    grid = GRID.replace("{name: math500, samples: 3}", "{name: ruler.niah_single_1, lengths: [512], samples: 2}")
    plain = {c.policy + "|" + c.task.name: c for c in expand(parse_grid(grid))}
    kv = {c.policy + "|" + c.task.name: c for c in expand(parse_grid(grid + "protocol: {compress: context, decode: keep}\n"))}
    assert kv["full|needle"].id == plain["full|needle"].id  # full never evicts: one cell serves every protocol
    assert kv["keydiff|needle"].id != plain["keydiff|needle"].id
    task = kv["keydiff|needle"].to_task()
    assert (task.compress, task.decode) == ("context", "keep")
    assert "protocol=context/keep" in kv["keydiff|needle"].describe()


@pytest.mark.parametrize("extra, message", [
    ("protocol: {compress: middle}\n",
     "protocol.compress: Input should be 'prompt', 'context' or 'generated'"),
    ("protocol: {decode: drop}\n", "protocol.decode: Input should be 'evict' or 'keep'"),
    ("protocol: {compress: context}\n", "protocol.compress: context: tasks[1] (math500) has no question apart "
                                        "from its context"),
    ("generation: {temperature: 0.7}\n", "generation.temperature: unknown field"),
])
def test_bad_protocol_and_generation_settings_name_the_field(extra, message):
    with pytest.raises(GridError) as e:
        parse_grid(GRID + extra)
    assert message in str(e.value)


def test_a_budget_below_what_a_policy_always_keeps_is_a_grid_error():
    grid = GRID.replace("{name: snapkv, params: {window: 8}}", "{name: sink, params: {n_sink_tokens: 100}}")
    with pytest.raises(GridError) as e:
        parse_grid(grid)
    assert "budgets: must be >= the 100 tokens policy 'sink' always keeps" in str(e.value)
    assert "(policies[2])" in str(e.value)


def test_missing_data_is_a_grid_error_naming_the_task_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(tmp_path))
    with pytest.raises(GridError) as e:
        expand(parse_grid(GRID))
    text = str(e.value)
    assert f"tasks[1]: math500: data file not found: {tmp_path}/math500/test.jsonl" in text
    assert "`params: {source: hub}`" in text


def test_batch_size_and_shards_are_stored_but_not_hashed(data_dir):
    batched = expand(parse_grid(GRID + "generation: {batch_size: 4}\nresources: {shard_size: 2}\n"))
    assert {c.policy + "|" + c.task.name: c.id for c in batched} == _ids()
    assert {c.to_task().batch_size for c in batched} == {4}


def test_an_unset_batch_size_is_chosen_per_worker():
    import torch

    from kdeval.cluster.execute import CPU_BATCH_SIZE, default_batch_size

    class LM:
        model = torch.nn.Linear(2, 2)

    cell = expand(parse_grid(GRID.replace("  - {name: math500, samples: 3}\n", "")))[1]
    assert cell.to_task().batch_size is None
    assert default_batch_size(LM(), cell.to_task()) == CPU_BATCH_SIZE
    eager = cell.model_copy(update={"model": cell.model.model_copy(update={"attn_implementation": "eager"})})
    assert default_batch_size(LM(), eager.to_task()) == 1  # batches need the engine's masked SDPA
