"""A model's own code never runs and no kdeval command asks on stdin whether to run it: a config whose
``auto_map`` names ``configuration_evil.py`` is refused at submit in one line, with ``y`` on stdin and with
stdin closed alike, and the file never runs (it would write a marker); a model loads with
``trust_remote_code=False``; ``generate`` on such a directory, or on a FIFO as its prompt file, is one line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.jobs.grid.test_hostile_model_config import GOOD, GRID, safetensors

runner = CliRunner()
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\n"


def evil_model(root: Path, model_type: str = "evil") -> tuple[Path, Path]:
    """A model directory whose config and tokenizer name custom code that writes a marker; (directory,
    marker)."""
    d, marker = root / "m", root / "marker"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**GOOD, "model_type": model_type, "auto_map": {
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}}))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (d / name).write_text(EVIL.format(marker=str(marker)))
    safetensors(d / "model.safetensors")
    return d, marker


@pytest.mark.parametrize("stdin", ["y\n", None], ids=["yes-on-stdin", "stdin-closed"])
def test_custom_code_is_refused_at_submit_and_never_runs(tmp_path, stdin):
    d, marker = evil_model(tmp_path)
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(model=d))
    out = subprocess.run([sys.executable, "-m", "kdeval.cli.app", "submit", str(grid), "--dry-run", "--db",
                          str(tmp_path / "i.sqlite")], input=stdin,
                         stdin=subprocess.DEVNULL if stdin is None else None,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 2, out.stdout + out.stderr
    assert (f"models[0].id: {d}/config.json: auto_map: the model needs code of its own "
            "(configuration_evil.py, modeling_evil.py), which kdeval never runs") in out.stderr
    assert "[y/N]" not in out.stdout + out.stderr and "custom code" not in out.stdout + out.stderr
    assert not marker.exists()


def test_a_shipped_architecture_beside_an_auto_map_loads_without_its_code(tmp_path):
    """``model_type: llama`` with an ``auto_map``: transformers' own Llama classes, the custom files never
    run."""
    from kdeval.zoo.model_config import model_tokenizer

    d, marker = evil_model(tmp_path, "llama")
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(model=d))
    r = runner.invoke(__import__("kdeval.cli.app", fromlist=["app"]).app,
                      ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "i.sqlite")], input="y\n",
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert model_tokenizer(str(d)) is None  # no tokenizer files: None, and no prompt
    assert not marker.exists()


def test_load_model_refuses_custom_code_in_one_line(tmp_path):
    from kdeval.zoo import load_model

    d, marker = evil_model(tmp_path)
    with pytest.raises(ValueError, match="auto_map: the model needs code of its own"):
        load_model(str(d), device="cpu")
    assert not marker.exists()


def test_generate_on_custom_code_or_a_fifo_prompt_is_one_line(tmp_path):
    from kdeval.cli.app import app

    d, marker = evil_model(tmp_path)
    r = runner.invoke(app, ["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "1"],
                      input="y\n")
    assert r.exit_code == 2 and r.output.strip().startswith(f"error: {d}/config.json: auto_map:"), r.output
    assert len(r.output.strip().splitlines()) == 1 and not marker.exists()
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    r = runner.invoke(app, ["generate", "--model", "random:llama-tiny", "--prompt-file", str(fifo)])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: --prompt-file: {fifo} is a FIFO; expected a regular file", r.output
