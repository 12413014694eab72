"""Settings that would take no effect are found at submit: a chunk size that holds every prompt beside
``whole`` is refused in one line; a KIVI window that covers a budget is said in one line (the quantized cell
peaks as the unquantized one does: checked against the engine's own peak bytes)."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.jobs.grid.cells import expand_grid
from kdeval.jobs.grid.load import parse_grid

runner = CliRunner()
GRID = ("name: none\nmodels: [random:llama-tiny]\npolicies: [full, keydiff]\nbudgets: [64, 256]\n"
        "chunk_sizes: [64]\n"
        "tasks: [{name: needle, lengths: [512], samples: 1}]\ngeneration: {max_new_tokens: 2}\n")


def _dry(tmp_path, text: str):
    grid = tmp_path / "g.yaml"
    grid.write_text(text)
    return runner.invoke(kdeval_app, ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")],
                         env={"COLUMNS": "400"})


@pytest.mark.parametrize("chunks", ["[64, 512, whole]", "[64, 4096, whole]"])
def test_a_chunk_holding_every_prompt_beside_whole_is_refused(tmp_path, chunks):
    r = _dry(tmp_path, GRID.replace("chunk_sizes: [64]", f"chunk_sizes: {chunks}"))
    lines = [ln.strip() for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    size = chunks.split(", ")[1]
    assert lines[1:] == [f"chunk_sizes[1]: {size} tokens per chunk hold every prompt of the grid in one "
                         "chunk (the longest task length is 512), as 'whole' (chunk_sizes[2]) does: its "
                         "cells would repeat whole's; expected a chunk below 512"], r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


@pytest.mark.parametrize("text,chunks", [
    (GRID.replace("chunk_sizes: [64]", "chunk_sizes: [64, 511, whole]"), ["64", "511", "whole"]),  # below
    (GRID.replace("chunk_sizes: [64]", "chunk_sizes: [64, 512]"), ["64", "512"]),  # no whole to repeat
    (GRID.replace("chunk_sizes: [64]", "chunk_sizes: [64, 4096, whole]").replace(  # a task of natural lengths
        "tasks: [", "tasks: [{name: longbench.qasper, samples: 1}, "), ["64", "4096", "whole"]),
], ids=["below", "no-whole", "natural-lengths"])
def test_chunks_that_can_differ_from_whole_pass(text, chunks):
    """Accepted with every chunk size kept (none refused as a repeat of whole); on tasks of target lengths each
    makes cells of its own."""
    grid = parse_grid(text)
    assert [str(c) for c in grid.chunk_sizes] == chunks
    if "longbench" not in text:  # its data is not in the suite's data dir: the chunk rule is parse_grid's
        assert sorted({str(c.chunk_size) for c in expand_grid(grid).cells}) == sorted(chunks)


def _notes(text: str) -> list[str]:
    return [n for n in expand_grid(parse_grid(text)).notes if n.startswith("kv_quant")]


def test_a_window_covering_a_budget_is_said_at_submit(tmp_path):
    text = GRID + "kv_quant: [none, {bits: 4, group_size: 16}]\n"
    line = ("kv_quant[1].window: 128 recent tokens in full precision cover budgets[0] 64 (at chunk 64): the "
            "cache peaks (N kept + a chunk of B) before any kept token is older than the window, so those "
            "4-bit cells' peak_kv_bytes are the unquantized ones'; a window below 64 makes the store smaller "
            "at its peak")
    assert _notes(text) == [line]
    r = _dry(tmp_path, text)
    assert r.exit_code == 0 and f"note: {line}" in r.output, r.output
    assert _notes(text.replace("group_size: 16}", "group_size: 16, window: 32}")) == []
    assert _notes(text.replace("[full, keydiff]", "[full, pyramidkv]")) == []  # per-layer budgets: not N each


@pytest.mark.parametrize("budget,chunk,window,said", [(128, 64, 128, True), (100, 64, 128, True),
                                                      (64, 64, 32, False), (128, 64, 64, False)])
def test_the_note_is_the_engines_peak(budget, chunk, window, said):
    """The note is said exactly when the engine's quantized peak equals its unquantized one."""
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    text = GRID.replace("budgets: [64, 256]", f"budgets: [{budget}]").replace("[64]", f"[{chunk}]") + (
        f"kv_quant: [{{bits: 4, group_size: 16, window: {window}}}]\n")
    assert bool(_notes(text)) == said
    lm = load_model("random:llama-tiny", device="cpu")
    ids = torch.randint(3, 250, (1, 512), generator=torch.Generator().manual_seed(0))
    peaks = []
    for quant in (None, {"bits": 4, "group_size": 16, "window": window}):
        engine = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=budget, chunk_size=chunk,
                                                                      kv_quant=quant))
        peaks.append(engine.generate(ids, max_new_tokens=2).stats.to_dict()["peak_kv_bytes"])
    assert (peaks[0] == peaks[1]) == said, peaks
