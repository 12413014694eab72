"""Settings a model cannot take are refused at submit, ``--dry-run`` included, each one line naming its field
(exit 2, nothing written), read from the model's config without its weights: a ``kv_quant`` group that does not
divide head_dim, budgets, chunk sizes and lengths beyond the context, task lengths too short for the task's
template or a conversation's turns, and model ids that name no loadable model. An unset KIVI group is derived
from head_dim and said so."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.zoo.model_config import model_shape

runner = CliRunner()
ENV = {"COLUMNS": "300"}
GRID = ("name: fit\nmodels: [random:llama-tiny]\npolicies: [full, keydiff]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{name: needle, lengths: [512], samples: 1}]\ngeneration: {max_new_tokens: 2}\n")


def _submit(tmp_path, text: str, dry: bool = True, env: dict[str, str] = ENV):
    grid = tmp_path / "g.yaml"
    grid.write_text(text)
    args = ["submit", str(grid), "--db", str(tmp_path / "i.sqlite"), "--results-dir", str(tmp_path / "results")]
    return runner.invoke(kdeval_app, args + (["--dry-run"] if dry else []), env=env)


CASES = {
    "kivi-group": (GRID + "kv_quant: [none, {bits: 4, group_size: 32}]\n",
                   "kv_quant[1].group_size: expected a divisor of models[0] (random:llama-tiny)'s head_dim 16, got 32"),
    "length": (GRID.replace("lengths: [512]", "lengths: [1000000000]"),
               "tasks[0].lengths[0]: 1000000000 tokens is more than models[0] (random:llama-tiny)'s context of 4096 "
               "tokens (max_position_embeddings)"),
    "budget": (GRID.replace("budgets: [64]", "budgets: [64, 8192]"),
               "budgets[1]: 8192 tokens kept is more than models[0] (random:llama-tiny)'s context of 4096 tokens"),
    "chunk": (GRID.replace("chunk_sizes: [32]", "chunk_sizes: [5000]"),
              "chunk_sizes[0]: 5000 tokens per chunk is more than models[0] (random:llama-tiny)'s context"),
    "needle-template": (GRID.replace("lengths: [512]", "lengths: [256]"),
                        "tasks[0]: needle at length 256: target length 256 is too small: the template alone"),
    "turns": (GRID.replace("{name: needle, lengths: [512], samples: 1}",
                           "{name: turns.kv, lengths: [512], samples: 1, params: {turns: 1000}}"),
              "tasks[0]: turns.kv at length 512: target length 512 is too small: the template alone with 1000 unit"),
    "turns-needles": (GRID.replace("{name: needle, lengths: [512], samples: 1}",
                                   "{name: turns.needles, lengths: [64], samples: 1}"),
                      "tasks[0]: turns.needles at length 64: target length 64 is too small"),
    "parent-path": (GRID.replace("[random:llama-tiny]", "['../../../../../../etc']"),
                    "models[0].id: ../../../../../../etc is a directory without config.json"),
    "file-url": (GRID.replace("[random:llama-tiny]", "['file:///etc/passwd']"), "models[0].id: a URL is not a model id"),
    "http-url": (GRID.replace("[random:llama-tiny]", "['http://127.0.0.1:9/x']"), "models[0].id: a URL is not a model id"),
    "windowed-policy": (GRID.replace("[random:llama-tiny]", "[random:gemma3-tiny]").replace("[full, keydiff]",
                                                                                         "[full, ada-keydiff]"),
                        "policies[1]: 'ada-keydiff' shares a layer's slots among its KV heads; not supported on a model "
                        "with windowed (sliding or chunked) attention layers (models[0] random:gemma3-tiny)"),
    "latent-policy": (GRID.replace("[random:llama-tiny]", "[random:deepseek-v3-tiny]").replace(
        "[full, keydiff]", "[full, expected-attention]"),
        "policies[1]: 'expected-attention' reads the cached values, which a multi-head latent attention (MLA) cache "
        "does not hold (it keeps one compressed latent and one shared rotary key a token) "
        "(models[0] random:deepseek-v3-tiny)"),
    "bad-hub-id": (GRID.replace("[random:llama-tiny]", "['a/b/c']"), "models[0].id: expected a known name, a local"),
}


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "submit"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_setting_the_model_cannot_take_is_one_line_at_submit(tmp_path, case, dry):
    text, line = CASES[case]
    r = _submit(tmp_path, text, dry)
    lines = [ln.strip() for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 2 and lines[0].endswith("1 problem"), r.output
    assert lines[1].startswith(line), r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]  # no index, no results directory


def test_an_unset_kivi_group_is_derived_from_head_dim_and_said(tmp_path):
    text = GRID.replace("[random:llama-tiny]", "[random:llama-tiny, random:qwen2-tiny]") + "kv_quant: [{bits: 4}]\n"
    r = _submit(tmp_path, text, env={"COLUMNS": "400"})  # the table whole
    assert r.exit_code == 0, r.output
    assert ("note: kv_quant[0].group_size: unset, so 16 for random:llama-tiny (its head_dim 16 does not take "
            "KIVI's 32)") in r.output, r.output
    assert "kv_quant=kivi-4b-g16-w128" in r.output and "kv_quant=kivi-4b-g32-w128" in r.output  # qwen2-tiny: 32


def test_a_local_model_directory_is_read_from_its_config_json(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 96, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "max_position_embeddings": 1024}))
    shape = model_shape(str(d))
    assert (shape.head_dim, shape.context, shape.kv_heads) == (24, 1024, 2)
    r = _submit(tmp_path, GRID.replace("[random:llama-tiny]", f"['{d}']") + "kv_quant: [{bits: 4, group_size: 16}]\n")
    assert r.exit_code == 2 and f"kv_quant[0].group_size: expected a divisor of models[0] ({d})'s head_dim 24" in r.output
