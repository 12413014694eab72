"""A grid may list protocols (each cell runs one) and chunk size ``whole``: the cells of each protocol are exactly
those of a grid giving that protocol alone (same ids), ``full`` runs once; bad entries name their path."""
from __future__ import annotations

import pytest

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from tests.user_env import user_env

GRID = """
models: [random:llama-tiny]
policies: [full, keydiff]
budgets: [64, 25%]
chunk_sizes: [32, whole]
tasks: [{{name: needle, lengths: [512], samples: 2, params: {{depths: [50]}}}}]
protocol: {protocol}
"""
AWARE, AGNOSTIC = "{compress: prompt, decode: evict}", "{compress: context, decode: evict}"


def ids(protocol: str) -> dict[str, object]:
    return {c.id: c for c in expand(parse_grid(GRID.format(protocol=protocol)), version="v")}


def test_a_protocol_list_is_the_union_of_single_protocol_grids():
    both, aware, agnostic = ids(f"[{AWARE}, {AGNOSTIC}]"), ids(AWARE), ids(AGNOSTIC)
    assert set(both) == set(aware) | set(agnostic)
    assert len(both) == 2 * 1 + 2 * 2 * 2  # full per chunk size; keydiff per chunk × budget × protocol
    whole = [c for c in both.values() if c.chunk_size == "whole"]
    assert len(whole) == 5 and all(c.record().chunk_size == 0 for c in whole)
    assert {c.describe().split(" B=")[1].split()[0] for c in both.values()} == {"32", "whole"}


@pytest.mark.parametrize("protocol,message", [
    ("[]", "protocol: a list of protocols must name at least one, each once"),
    (f"[{AWARE}, {AWARE}]", "protocol: a list of protocols must name at least one, each once"),
    ("[{compres: prompt}]", "protocol[0].compres: unknown field (did you mean 'compress'?)"),
    ("[{compress: promt}]", "protocol[0].compress: Input should be 'prompt', 'context' or 'generated'"),
    ("7", "protocol: expected a mapping or a list of mappings, got 7"),
])
def test_bad_protocols_name_their_path(protocol, message):
    with pytest.raises(GridError) as e:
        parse_grid(GRID.format(protocol=protocol))
    assert [str(i) for i in e.value.issues if str(i).startswith("protocol")] == [
        next(str(i) for i in e.value.issues if str(i).startswith(message))]


def test_status_and_progress_labels_tell_the_protocols_apart(paths):
    """The same policy, budget and chunk under both protocols: two rows that must not read the same."""
    import io

    from rich.console import Console

    from kdeval.cli.status_view import status_table
    from kdeval.jobs.run.scheduler import _cell_label

    from tests.support.helpers import new_run

    text = GRID.format(protocol=f"[{AWARE}, {AGNOSTIC}]")
    idx, run_id, plan = new_run(paths["db"], paths["results"], text)
    buf = io.StringIO()
    Console(file=buf, width=160, markup=False).print(status_table(idx, run_id, 160))  # as the CLI prints; no fold
    keydiff = [ln.split()[1:4] for ln in buf.getvalue().splitlines() if " keydiff" in ln]
    assert len(keydiff) == 8 and len({tuple(k) for k in keydiff}) == 8, keydiff
    assert sum("[query-agnostic]" in " ".join(k) for k in keydiff) == 4
    labels = {_cell_label(c) for c in plan.cells}
    assert len(labels) == len(plan.cells) and any(" 64/whole " in lb for lb in labels)
    assert sum("keydiff [query-agnostic]" in lb for lb in labels) == 4
    idx.close()


def test_status_tells_two_settings_of_one_policy_apart(paths):
    """``snapkv`` and ``snapkv(pooling=avg)``, ``ada`` around two inner policies: status prints each cell's own
    label (the one reports and progress print), not the bare policy name."""
    import io

    from rich.console import Console

    from kdeval.cli.status_view import status_table

    from tests.support.helpers import new_run

    text = GRID.format(protocol=AWARE).replace(
        "policies: [full, keydiff]", "policies: [snapkv, {name: snapkv, params: {pooling: avg}}, "
        "{name: ada, params: {inner: keydiff}}, {name: ada, params: {inner: {name: snapkv}}}]")
    idx, run_id, plan = new_run(paths["db"], paths["results"], text)
    buf = io.StringIO()
    Console(file=buf, width=200, markup=False).print(status_table(idx, run_id, 200))
    rows = [ln.split()[1:3] for ln in buf.getvalue().splitlines() if " snapkv" in ln or " ada" in ln]
    assert len(rows) == len(plan.cells) == 16 and len({tuple(r) for r in rows}) == 16, rows
    assert sum(r[0] == "snapkv(pooling=avg)" for r in rows) == 4 and sum(r[0] == "ada(inner=keydiff)" for r in rows) == 4
    idx.close()


def test_a_wrapped_policy_reads_as_a_call_in_labels():
    from kdeval.jobs.grid.cells import policy_label

    assert policy_label("ada", {"inner": {"name": "snapkv", "params": {"pooling": "avg"}}}) == \
        "ada(inner=snapkv(pooling=avg))"
    assert policy_label("chunkkv", {"inner": {"name": "keydiff"}, "group_size": 5}) == \
        "chunkkv(group_size=5,inner=keydiff)"
    assert policy_label("snapkv", {"window": 32}) == "snapkv(window=32)" and policy_label("full", {}) == "full"


def test_status_at_80_columns_folds_a_protocol_label_between_words(paths):
    """A user's 80-column terminal: ``keydiff [query-agnostic]`` may take two lines, but the tag stays whole."""
    import os
    import subprocess
    import sys

    from tests.support.helpers import new_run

    idx, run_id, _ = new_run(paths["db"], paths["results"], GRID.format(protocol=f"[{AWARE}, {AGNOSTIC}]"))
    idx.close()
    env = user_env(COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "kdeval.cli.app", "status", run_id, "--db", str(paths["db"])],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert sum("[query-agnostic]" in ln for ln in lines) == 4, r.stdout
    assert not any("[query-agno" in ln and "[query-agnostic]" not in ln for ln in lines), r.stdout


def test_status_says_a_protocol_every_budgeted_cell_shares_once_under_the_table(paths):
    """One protocol for the whole run: the rows read as bare policies and the line under the table names the
    protocol once; ``full`` (no budget, no tag) does not stop it. Two protocols keep the tag on every row."""
    import io

    from rich.console import Console

    from kdeval.cli.status_view import status_table

    from tests.support.helpers import new_run

    def printed(protocol: str) -> list[str]:
        idx, run_id, _ = new_run(paths["db"], paths["results"], GRID.format(protocol=protocol))
        buf = io.StringIO()
        Console(file=buf, width=80, markup=False).print(status_table(idx, run_id, 80))
        idx.close()
        return buf.getvalue().splitlines()

    one = printed(AGNOSTIC)
    assert not any("[query-agnostic]" in ln for ln in one), one
    assert sum(ln.strip() == "every cell with a budget: query-agnostic" for ln in one) == 1, one
    assert sum(" keydiff " in ln for ln in one) == 4 and max(len(ln) for ln in one) <= 80
    both = printed(f"[{AWARE}, {AGNOSTIC}]")
    assert sum("[query-agnostic]" in ln for ln in both) == 4 and not any("every cell" in ln for ln in both), both


def test_the_prompt_kept_protocol_is_part_of_a_cells_identity():
    kept = ids("{compress: generated}")
    aware = ids(AWARE)
    full = [c for c in kept.values() if c.policy == "full"]
    assert {c.id for c in full} <= set(aware)  # full never evicts: one cell serves every protocol
    evicting = [c for c in kept.values() if c.policy != "full"]
    assert evicting and not {c.id for c in evicting} & set(aware)
    task = evicting[0].to_task()
    assert (task.compress, task.decode) == ("generated", "evict")
    assert "prompt-kept" in evicting[0].describe() or "generated" in evicting[0].describe()


@pytest.mark.parametrize("grid,message", [
    (GRID.format(protocol="{compress: generated, decode: keep}"),
     "protocol.decode: keep under compress: generated evicts nothing"),
    (GRID.format(protocol="{compress: generated}").replace("policies: [full, keydiff]",
                                                           "policies: [full, kvzip]"),
     "protocol.compress: generated: policies[1] 'kvzip' scores tokens by a repeat pass after evicting prompt "
     "steps, which generated tokens never get; it cannot run under compress 'generated'"),
    (GRID.format(protocol="{compress: generated}").replace(
        "{{name: needle, lengths: [512], samples: 2, params: {{depths: [50]}}}}".format(),
        "{name: turns.kv, lengths: [512], samples: 1}"),
     "protocol.compress: generated: tasks[0] (turns.kv) asks several questions per context"),
])
def test_what_the_prompt_kept_protocol_cannot_run_is_refused_at_submit(grid, message):
    with pytest.raises(GridError) as e:
        parse_grid(grid)
    assert message in str(e.value), str(e.value)
