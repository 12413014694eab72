"""A local model directory is untrusted input at submit: a hostile ``config.json`` (or tokenizer file, or
truncated weights) is one line naming the file and the field, exit 2, in well under 5 s, with nothing written,
for the dry run and the real submit alike; a FIFO or a device named ``config.json`` is refused before a byte
is read."""
from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.zoo.config_check import ModelConfigError, check_config, read_config

runner = CliRunner()
GOOD = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "max_position_embeddings": 1024, "vocab_size": 300, "intermediate_size": 128}
GRID = ("name: hostile\nmodels: ['{model}']\npolicies: [full, keydiff]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{{name: needle, lengths: [512], samples: 1}}]\ngeneration: {{max_new_tokens: 2}}\n")


def safetensors(path: Path, cut: int = 0) -> None:
    """A one-tensor safetensors file (``cut`` bytes short of what its header describes)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes((struct.pack("<Q", len(header)) + header + bytes(16))[:len(header) + 24 - cut])


def model_dir(root: Path, config: object = None, raw: bytes | None = None) -> Path:
    """A model directory: ``config`` (default :data:`GOOD`) as its config.json, or ``raw`` bytes; whole
    weights."""
    d = root / "m"
    d.mkdir()
    text = raw if raw is not None else json.dumps(GOOD if config is None else config).encode()
    (d / "config.json").write_bytes(text)
    safetensors(d / "model.safetensors")
    return d


def _with(**fields: object) -> dict:
    return {**GOOD, **fields}


def _json(text: str) -> bytes:
    return text.encode()


#: case: (config.json's bytes or mapping, the message after "<dir>/config.json"; a leading "is" is its own)
CASES: dict[str, tuple[object, str]] = {
    "layers-1e12": (_json(json.dumps(GOOD)[:-1] + ', "num_hidden_layers": 1e12}'),
                    "num_hidden_layers: expected a positive integer (at most 1024), got 1000000000000.0"),
    "layers-int-huge": (_with(num_hidden_layers=10**12),
                        "num_hidden_layers: expected a positive integer (at most 1024), got 1000000000000"),
    "kv-heads-infinity": (_json(json.dumps(GOOD)[:-1] + ', "num_key_value_heads": Infinity}'),
                          "num_key_value_heads: expected a finite number, got inf"),
    "kv-heads-string": (_with(num_key_value_heads="2"),
                        "num_key_value_heads: expected a positive integer (at most 1024) or null, got '2'"),
    "nesting-100": (_json('{"a": ' + "[" * 100 + "]" * 100 + "}"), "is nested deeper than 64 levels"),
    "deep-nesting": (_json('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                     "is nested deeper than 64 levels"),
    "heads-0": (_with(num_attention_heads=0),
                "num_attention_heads: expected a positive integer (at most 1024), got 0"),
    "heads-negative": (_with(num_attention_heads=-4),
                       "num_attention_heads: expected a positive integer (at most 1024), got -4"),
    "heads-float": (_with(num_attention_heads=4.0),
                    "num_attention_heads: expected a positive integer (at most 1024), got 4.0"),
    "kv-heads-0": (_with(num_key_value_heads=0),
                   "num_key_value_heads: expected a positive integer (at most 1024) or null, got 0"),
    "kv-heads-not-dividing": (_with(num_key_value_heads=3),
                              "num_key_value_heads: expected a divisor of num_attention_heads 4, got 3"),
    "head-dim-0": (_with(head_dim=0), "head_dim: expected a positive integer (at most 65536) or null, got 0"),
    "head-dim-negative": (_with(head_dim=-16),
                          "head_dim: expected a positive integer (at most 65536) or null, got -16"),
    "head-dim-string": (_with(head_dim="x"),
                        "head_dim: expected a positive integer (at most 65536) or null, got 'x'"),
    "hidden-1e12": (_json(json.dumps(GOOD).replace('"hidden_size": 64', '"hidden_size": 1e12')),
                    "hidden_size: expected a positive integer (at most 1048576), got 1000000000000.0"),
    "hidden-not-dividing": (_with(hidden_size=66),
                            "hidden_size: expected a multiple of num_attention_heads 4 (head_dim is not "
                            "given), got 66"),
    "layers-string": (_with(num_hidden_layers="2"),
                      "num_hidden_layers: expected a positive integer (at most 1024), got '2'"),
    "layers-bool": (_with(num_hidden_layers=True),
                    "num_hidden_layers: expected a positive integer (at most 1024), got True"),
    "context-0": (_with(max_position_embeddings=0),
                  "max_position_embeddings: expected a positive integer (at most 2147483647), got 0"),
    "rope-nan": (_json(json.dumps(GOOD)[:-1] + ', "rope_scaling": {"factor": NaN}}'),
                 "rope_scaling.factor: expected a finite number, got nan"),
    "rope-theta-negative": (_with(rope_theta=-1.0), "rope_theta: expected a positive number, got -1.0"),
    "invalid-utf8": (b'{"model_type": "llama\xff"}', "is not UTF-8 text (byte 0xff at offset 21)"),
    "not-json": (b"model_type: llama\n", "is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    "json-list": (b"[1, 2, 3]", "expected a JSON object (a transformers config), got a JSON list"),
    "unknown-model-type": (_with(model_type="llamaa"),
                           "model_type: 'llamaa' is not a family kdeval runs (did you mean 'llama'?); "
                           "`kdeval models` lists them"),
    "no-model-type": ({k: v for k, v in GOOD.items() if k != "model_type"},
                      "model_type: expected the name of a model family (llama, qwen2, ...), got None"),
    "mamba": (_with(model_type="mamba"),
              "model_type: 'mamba' is not supported: a state-space model has no KV cache"),
    "encoder-decoder": (_with(is_encoder_decoder=True),
                        "is_encoder_decoder: encoder-decoder models are not supported (decoder-only "
                        "causal LMs only)"),
    "unknown-layers": (_with(layer_types=["full_attention", "bogus_attention"]),
                       "layer_types: ['bogus_attention'] are not layers the engine runs (full, sliding-window or "
                       "chunked attention, linear-attention, Mamba or conv layers)"),
    "sparse-layers": (_with(layer_types=["full_attention", "deepseek_sparse_attention"]),
                      "layer_types: its sparse-attention layers (deepseek_sparse_attention) cache an indexer key "
                      "per token beside the keys and values, which the engine does not yet evict in step with them"),
    "wrapper-decoder-heads-0": ({"model_type": "qwen3_5", "text_config": _with(num_attention_heads=0)},
                                "text_config.num_attention_heads: expected a positive integer (at most 1024), "
                                "got 0"),
    "layer-types-count": (_with(layer_types=["full_attention"]),
                          "layer_types: expected one entry per layer (num_hidden_layers 2), got 1"),
    "custom-code": (_with(model_type="evil", auto_map={"AutoConfig": "configuration_evil.EvilConfig"}),
                    "auto_map: the model needs code of its own (configuration_evil.py), which kdeval never "
                    "runs (trust_remote_code stays off); use a model whose architecture transformers ships "
                    "(`kdeval models` lists the families)"),
}


def _fifo(d: Path) -> str:
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    return "config.json is a FIFO; expected a regular file"


def _device(d: Path) -> str:
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    return "config.json is a character device; expected a regular file"


def _huge(d: Path) -> str:
    with open(d / "config.json", "wb") as f:  # 50 MB (sparse: written in no time), refused before it is read
        f.truncate(50 << 20)
    return f"config.json is {50 << 20} bytes; at most {4 << 20} are read"


def _truncated(d: Path) -> str:
    safetensors(d / "model.safetensors", cut=8)
    return "model.safetensors is 78 bytes, but its header describes 86: truncated"


def _no_weights(d: Path) -> str:
    (d / "model.safetensors").unlink()
    return (" holds no weights; expected model.safetensors (or its index) beside config.json, as "
            "save_pretrained writes them")


def _tokenizer_fifo(d: Path) -> str:
    os.mkfifo(d / "tokenizer.json")
    return "tokenizer.json is a FIFO; expected a regular file"


def _tokenizer_code(d: Path) -> str:
    auto = {"auto_map": {"AutoTokenizer": ["tok_evil.EvilTok", None]}}
    (d / "tokenizer_config.json").write_text(json.dumps(auto))
    return ("tokenizer_config.json: auto_map: the tokenizer needs code of its own (tok_evil.py), which "
            "kdeval never runs (trust_remote_code stays off)")


def _tokenizer_deep(d: Path) -> str:
    (d / "special_tokens_map.json").write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    return "special_tokens_map.json is nested deeper than 64 levels"


MADE = {"fifo": _fifo, "device": _device, "50mb": _huge, "truncated-weights": _truncated,
        "no-weights": _no_weights, "tokenizer-fifo": _tokenizer_fifo,
        "tokenizer-custom-code": _tokenizer_code, "tokenizer-deep": _tokenizer_deep}


def _make(tmp_path: Path, case: str) -> tuple[Path, str]:
    """The model directory of ``case`` and the line its refusal must end with."""
    if case in MADE:
        d = model_dir(tmp_path)
        tail = MADE[case](d)
        return d, (f"{d}/{tail}" if not tail.startswith(" ") else f"{d}{tail}")
    content, tail = CASES[case]
    tail = f" {tail}" if tail.startswith("is ") else f": {tail}"
    d = model_dir(tmp_path, raw=content) if isinstance(content, bytes) else model_dir(tmp_path, content)
    return d, f"{d}/config.json{tail}"


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "submit"])
@pytest.mark.parametrize("case", list(CASES) + list(MADE))
def test_a_hostile_model_directory_is_one_line_at_submit(tmp_path, case, dry):
    d, tail = _make(tmp_path, case)
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(model=d))
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["submit", str(grid), "--db", str(tmp_path / "i.sqlite"),
            "--results-dir", str(tmp_path / "results")]
    start = time.perf_counter()
    r = runner.invoke(kdeval_app, args + (["--dry-run"] if dry else []), env={"COLUMNS": "400"})
    took = time.perf_counter() - start
    lines = [ln.strip() for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 2 and lines[0].endswith("1 problem"), r.output
    assert lines[1] == f"models[0].id: {tail}", r.output
    assert took < 5, took
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no index, no results directory


def test_a_good_model_directory_passes_the_dry_run(tmp_path):
    d = model_dir(tmp_path)
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(model=d))
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--db", str(tmp_path / "i.sqlite"), "--dry-run"],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("case", [c for c, (content, _) in CASES.items() if isinstance(content, dict)])
def test_check_config_refuses_each_hostile_mapping(case):
    content, tail = CASES[case]
    with pytest.raises(ModelConfigError) as e:
        check_config(content, "c.json")
    assert str(e.value) == f"c.json: {tail}"


def test_the_pinned_and_family_configs_pass(tmp_path):
    from kdeval.zoo.families import FAMILIES
    from kdeval.zoo.model_config import OFFLINE_CONFIGS

    from kdeval.zoo.config_check import UNSUPPORTED_TYPES

    for name, config in [(f.key, f.kwargs()) for f in FAMILIES if f.model_type not in UNSUPPORTED_TYPES] + list(
            OFFLINE_CONFIGS.items()):
        assert check_config(dict(config, vocab_size=300), name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    assert read_config(path) == GOOD
