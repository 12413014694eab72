"""The grid's ``conversation`` field: which cells carry it, what enters their id, and what is refused."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

BASE = """
name: turns
models: [random:llama-tiny]
policies: [full, keydiff]
budgets: [64]
chunk_sizes: [32]
generation: {max_new_tokens: 4}
tasks:
  - {name: needle, lengths: [400], samples: 2, params: {depths: [25, 75], haystack: noise}}
"""
TURNS = "  - {name: turns.kv, lengths: [400], samples: 2, params: {turns: 3}}\n"


def _cells(text: str) -> dict[tuple, object]:
    return {(c.policy, c.task.name, c.conversation.label if c.conversation else None): c
            for c in expand(parse_grid(text), version="test")}  # the code's hash is test_identity's


def test_only_multi_question_cells_carry_a_conversation_and_one_task_keeps_its_ids():
    alone = _cells(BASE)
    mixed = _cells(BASE + TURNS)  # no conversation field: multi-question tasks run multi-turn, golden answers
    assert set(mixed) == set(alone) | {("full", "turns.kv", "multi-turn/golden"),
                                       ("keydiff", "turns.kv", "multi-turn/golden")}
    for key, cell in alone.items():
        assert mixed[key].id == cell.id  # the needle cells are the cells they were
    both = _cells(BASE.replace("  - {name: needle, lengths: [400], samples: 2, params: {depths: [25, 75], "
                               "haystack: noise}}\n", "") + TURNS
                  + "conversation: [{mode: multi-turn}, {mode: multi-request}, {answers: own}]\n")
    assert sorted(k for k in both if k[0] == "full") == [("full", "turns.kv", m) for m in
                                                         ("multi-request", "multi-turn/golden", "multi-turn/own")]
    assert both[("keydiff", "turns.kv", "multi-turn/golden")].id == mixed[("keydiff", "turns.kv",
                                                                            "multi-turn/golden")].id
    assert len({c.id for c in both.values()}) == 6
    assert both[("keydiff", "turns.kv", "multi-request")].to_task().conversation == {"mode": "multi-request",
                                                                                   "answers": "golden"}


def test_bad_conversations_exit_2_with_one_line_and_write_nothing(app, paths, monkeypatch):
    monkeypatch.setenv("KDEVAL_DATA_DIR", str(FIXTURES))
    cases = {
        BASE + "conversation: {mode: multi-turn}\n":
            "conversation: tasks[0] (needle) asks one question per context",
        BASE.replace("needle, lengths: [400], samples: 2, params: {depths: [25, 75], haystack: noise}",
                     "turns.kv, lengths: [400]") + "conversation: {mode: chat}\n":
            "conversation.mode: Input should be 'multi-turn' or 'multi-request' (got 'chat')",
        BASE.replace("needle, lengths: [400], samples: 2, params: {depths: [25, 75], haystack: noise}",
                     "turns.kv, lengths: [400]") + "conversation: {mode: multi-request, answers: own}\n":
            "conversation: answers: 'own' needs mode 'multi-turn'",
    }
    for i, (text, line) in enumerate(cases.items()):
        grid = paths["db"].parent / f"g{i}.yaml"
        grid.write_text(text)
        res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--dry-run"],
                                 terminal_width=300)
        assert res.exit_code == 2, res.output
        assert line in res.output, res.output
        assert not paths["db"].exists()
