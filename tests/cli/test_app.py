"""The `kdeval` app: commands load lazily (help without torch, matplotlib or Ray), the listing says what each
command's own help says, and `generate` keeps GPU speed options out of its help and third-party noise off
the terminal."""
from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from kdeval.cli.app import COMMANDS, app, load

HEAVY = ("torch", "matplotlib", "ray", "transformers")


def _imported_by(args: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter has imported after ``kdeval ARGS`` (run in it)."""
    code = ("import sys\nfrom kdeval.cli.app import main\n"
            f"sys.argv = ['kdeval', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('IMPORTED', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("IMPORTED"))
    return eval(line.split(" ", 1)[1])  # a list literal printed by the child


@pytest.mark.parametrize("args", [["--help"], ["report", "--help"], ["tasks"], ["generate", "--help"],
                                  ["policies", "--help"], ["score", "--help"], ["nightly", "--help"],
                                  ["status", "--db", "no-such-dir/index.sqlite"], ["submit", "--help"]])
def test_help_and_listings_import_neither_torch_matplotlib_nor_ray(args):
    assert _imported_by(args) == []


def test_the_listing_says_what_each_command_says():
    group = typer.main.get_group(app)
    for name, (module, short) in COMMANDS.items():
        cmd = load(group, name)
        first_paragraph = " ".join(cmd.help.strip().split("\n\n")[0].split())
        assert short == first_paragraph, (name, module)
    assert set(group.commands) == set(COMMANDS)  # every command the modules register is listed
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0 and all(name in res.output for name in COMMANDS)


def test_an_unknown_command_suggests_the_closest():
    res = CliRunner().invoke(app, ["repor"])
    assert res.exit_code == 2 and "Did you mean 'report'" in res.output


def test_generate_has_no_unmeasured_gpu_speed_options():
    res = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for gone in ("--fuse-layers", "--compile-scoring", "--compile-blocks", "--attention-splits",
                 "--flex-attention"):
        assert gone not in res.output
    assert "--graphs" in res.output and "--verbose" in res.output and "--budget" in res.output
    bad = CliRunner().invoke(app, ["generate", "--model", "random:llama-tiny", "--prompt", "x" * 40,
                                   "--attention-splits", "0"])
    assert bad.exit_code == 2 and "No such option: --attention-splits" in bad.output


def test_generate_prints_kdeval_words_first_and_no_third_party_noise():
    cmd = [sys.executable, "-m", "kdeval.cli.app", "generate", "--model", "random:llama-tiny", "--prompt", "y" * 300,
           "--budget", "64", "--chunk", "32", "--max-new-tokens", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no progress bars, tokenizer notices or Python warnings
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert lines[0] == "keydiff keeps N=64 tokens per layer and KV head, chunks of B=32"
    assert lines[1].startswith("answer:")
    assert any("TTFT s" in ln for ln in lines) and any("KV cache MiB" in ln for ln in lines)
    assert [ln for ln in lines[2:] if "_" in ln] == []  # labels in words, no row keys (replayed_steps was one)
    full = subprocess.run(cmd[:-6] + ["--max-new-tokens", "1"], capture_output=True, text=True, timeout=300)
    assert full.returncode == 0 and full.stdout.splitlines()[0] == "no eviction (full cache)"
