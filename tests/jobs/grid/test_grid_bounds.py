"""Values that storage or Ray cannot take are grid errors: one line naming the field, exit 2, before anything
is written or started; read-only commands never write an index."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kdeval.jobs.grid.load import MAX_GRID_BYTES

from tests.jobs.grid.test_grid import BASE

runner = CliRunner()

BIG = "x" * 10_000_000


def _resources(extra: str) -> str:
    return BASE.replace("{workers: 2}", f"{{workers: 2, {extra}}}")


BOUNDED = {
    "budget-2^31": (BASE.replace("[64, 128, 256]", "[64, 2147483648]"), "budgets[1]: must be at most 2147483647"),
    "budget-2^63": (BASE.replace("[64, 128, 256]", "[64, 9223372036854775808]"), "budgets[1]: must be at most"),
    # YAML reads 1e23 as text, 1.0e+23 as a number; neither may become a seed
    "seed-1e23": (BASE.replace("seeds: [0, 1]", "seeds: [1e23]"), "tasks[0].seeds[0]: Input should be a valid integer"),
    "seed-1.0e+23": (BASE.replace("seeds: [0, 1]", "seeds: [1.0e+23]"),
                     "tasks[0].seeds[0]: must be at most 2147483647"),
    "length-2^40": (BASE.replace("[256, 512]", "[256, 1099511627776]"), "tasks[0].lengths[1]: must be at most"),
    "chunk-2^31": (BASE.replace("[32, 64]", "[32, 2147483648]"), "chunk_sizes[1]: must be at most"),
    "cpus-inf": (_resources("cpus_per_worker: .inf"),
                 "resources.cpus_per_worker: must be a finite number, got inf"),
    "cpus-nan": (_resources("cpus_per_worker: .nan"),
                 "resources.cpus_per_worker: must be a finite number, got nan"),
    "cpus-1e30": (_resources("cpus_per_worker: 1e30"),
                  "resources.cpus_per_worker: Input should be less than or equal to 1024 (got '1e30')"),
    "cpus-1.0e+30": (_resources("cpus_per_worker: 1.0e+30"),
                     "resources.cpus_per_worker: must be at most 2147483647"),
    "cpus-2048": (_resources("cpus_per_worker: 2048"),
                  "resources.cpus_per_worker: Input should be less than or equal to 1024"),
    "gpus-inf": (_resources("gpus_per_worker: .inf"),
                 "resources.gpus_per_worker: must be a finite number"),
    "timeout-nan": (BASE + "retries: {cell_timeout_s: .nan}\n", "retries.cell_timeout_s: must be a finite number"),
    "max-new-tokens-1e12": (BASE + "generation: {max_new_tokens: 1000000000}\n",
                            "generation.max_new_tokens: Input should be less than or equal to 1000000"),
    "param-inf": (BASE.replace("window_fraction: 0.5", "window_fraction: .inf"),
                  "policies[2].params.window_fraction: must be a finite number"),
    "name-nul": (BASE.replace("name: g", 'name: "g\\0h"'), "name: must not contain control characters"),
    "name-newline": (BASE.replace("name: g", 'name: "g\\nh"'), "name: must not contain control characters"),
    "model-nul": (BASE.replace("random:llama-tiny,", '"random:llama\\0tiny",'),
                  "models[0]: must not contain control characters"),
    "task-name-escape": (BASE.replace("{name: needle,", '{name: "needle\\e[31m",'),
                         "tasks[0].name: must not contain control characters"),
    "model-id-301": (BASE.replace("random:llama-tiny,", "m" * 301 + ","),
                     "models[0].id: String should have at most 300 characters"),
    "name-10MB": (BASE.replace("name: g", f"name: {BIG[:MAX_GRID_BYTES - 1000]}"),
                  "name: String should have at most 200 characters (got 'xxxx"),
}


@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_out_of_bounds_values_are_one_line_errors_before_anything_is_written(app, paths, case):
    text, expected = BOUNDED[case]
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(text)
    r = runner.invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 2, r.output
    assert expected in r.output, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith(f"invalid grid in {grid}: 1 problem") and len(lines) == 2, r.output
    assert len(r.output) < 1000  # a huge value is not echoed back whole
    assert not paths["db"].exists() and not paths["results"].exists()


def test_a_grid_file_over_1_mib_is_refused_before_it_is_parsed(app, paths):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(f"name: {BIG}\n" + BASE.replace("name: g\n", ""))
    r = runner.invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 2
    assert r.output.splitlines()[1] == (f"  the grid is {grid.stat().st_size} bytes; at most {MAX_GRID_BYTES} "
                                        "bytes (1 MiB) are accepted")
    assert len(r.output) < 500 and not paths["db"].exists()


def test_a_huge_unknown_name_is_cut_in_the_message(app, paths):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(BASE.replace("[full, keydiff,", f"[full, {BIG[:500_000]},"))
    r = runner.invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 2 and "unknown policy 'xxx" in r.output and "characters cut" in r.output
    assert len(r.output) < 1500


def test_values_at_the_bounds_are_accepted():
    from kdeval.jobs.grid.load import parse_grid

    # the stub model has no context to check a budget against (a real one refuses N beyond it: test_model_fit.py)
    grid = parse_grid(BASE.replace("[64, 128, 256]", "[64, 2147483647]").replace(
        "[random:llama-tiny, {id: random:qwen2-tiny, dtype: bfloat16}]", "['stub:0.01']").replace("{workers: 2}",
                                   "{workers: 2, cpus_per_worker: 1024}")
                      + "generation: {max_new_tokens: 1000000}\nretries: {cell_timeout_s: 3600.5}\n")
    assert grid.budgets == [64, 2147483647] and grid.resources.cpus_per_worker == 1024
    assert grid.generation.max_new_tokens == 1_000_000


@pytest.mark.parametrize("command", [["status"], ["ls"], ["status", "r1"], ["status", "--json"]])
def test_read_only_commands_leave_an_empty_index_file_empty(app, paths, command):
    paths["db"].write_bytes(b"")
    r = runner.invoke(app, command + ["--db", str(paths["db"])])
    assert r.exit_code == 2, r.output
    assert r.output == f"error: --db: {paths['db']} holds no kdeval index (an empty database; nothing submitted " \
                       "to it yet?)\n"
    assert paths["db"].stat().st_size == 0
    assert sorted(p.name for p in paths["tmp"].iterdir()) == ["index.sqlite"]  # no -wal, no -shm


def test_report_leaves_an_empty_index_file_empty(paths):
    from kdeval.cli.app import app as kdeval_app

    paths["db"].write_bytes(b"")
    r = runner.invoke(kdeval_app, ["report", "--db", str(paths["db"])])
    assert r.exit_code == 2 and "holds no kdeval index" in r.output and len(r.output.splitlines()) == 1
    assert paths["db"].stat().st_size == 0
