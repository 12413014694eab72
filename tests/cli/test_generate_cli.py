"""`kdeval generate` and `kdeval policies` through the real Typer app."""
import json

from typer.testing import CliRunner

from kdeval.cli.app import app

runner = CliRunner()


def test_generate_json_on_tiny_model():
    res = runner.invoke(app, ["generate", "--model", "random:llama-tiny", "--policy", "snapkv", "--budget", "40",
                              "--chunk", "16", "--prompt", "x" * 120, "--max-new-tokens", "4", "--param", "window=8",
                              "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["params"]["window"] == 8
    assert out["stats"]["prompt_tokens"] == 120
    assert out["stats"]["kept_tokens"] == 40
    assert out["stats"]["peak_kv_tokens"] <= 40 + 16


def test_generate_reads_prompt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hello " * 20)
    res = runner.invoke(app, ["generate", "--model", "random:qwen2-tiny", "--prompt-file", str(f), "--max-new-tokens", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["stats"]["prompt_tokens"] == 120


def test_generate_bad_input_exit_2():
    cases = [
        (["--budget", "0", "--prompt", "x"], "budget: must be a positive number"),
        (["--policy", "keydif", "--prompt", "x"], "did you mean 'keydiff'"),
        (["--param", "window", "--policy", "snapkv", "--prompt", "x"], "--param: expected key=value"),
        (["--param", "window=0", "--policy", "snapkv", "--prompt", "x"], "window: must be > 0"),
        ([], "give exactly one of --prompt or --prompt-file"),
        (["--prompt-file", "/nonexistent/p.txt"], "no such file"),
        (["--graphs", "--budget", "40", "--prompt", "x", "--device", "cpu"], "cuda_graphs: needs a CUDA device"),
    ]
    for extra, message in cases:
        res = runner.invoke(app, ["generate", "--model", "random:llama-tiny", *extra])
        assert res.exit_code == 2, (extra, res.output)
        assert message in res.stderr, (extra, res.stderr)


def test_generate_offers_no_test_or_experimental_engine_options():
    """The reference store, emulated graphs and bench's experimental speed options are not user options."""
    res = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--score-precision" in res.stdout and "--graphs" in res.stdout
    for hidden in ("--store", "--emulate", "--cache-layer", "--graph-runner", "--fuse", "--compile", "--attention-splits", "--flex"):
        assert hidden not in res.stdout, hidden
    res = runner.invoke(app, ["generate", "--model", "random:llama-tiny", "--prompt", "x", "--store", "gather"])
    assert res.exit_code == 2 and "No such option: --store" in res.output


def test_policies_json_lists_every_policy_with_params():
    res = runner.invoke(app, ["policies", "--json"])
    assert res.exit_code == 0
    infos = {p["name"]: p for p in json.loads(res.stdout)}
    assert {"full", "keydiff", "sink", "tova", "h2o", "snapkv", "knorm", "random"} <= set(infos)
    assert {"name": "window", "type": "int", "default": 32} in infos["snapkv"]["params"]
    assert infos["tova"]["needs"]["attention"] == "the last query" and infos["keydiff"]["needs"]["attention"] is None
    assert infos["chunkkv"]["needs"]["exact_ties"] and not infos["keydiff"]["needs"]["exact_ties"]
    assert infos["h2o"]["needs"]["token_state"] == ["acc"]


def test_policies_list_each_policys_extra_cost_from_its_needs():
    """The cost column and field come from what each policy says it needs (its default parameters)."""
    infos = {p["name"]: p for p in json.loads(runner.invoke(app, ["policies", "--json"]).stdout)}
    assert infos["snapkv"]["cost"] == "attention rows of the last 32 queries"
    assert infos["tova"]["cost"] == "attention rows of the last query"
    assert infos["h2o"]["cost"] == "attention rows of every query of the chunk; per-token state: 1 float"
    assert infos["random"]["cost"] == "no CUDA graphs (scores read the step count)"
    assert infos["keydiff"]["cost"] == infos["full"]["cost"] == infos["chunkkv"]["cost"] == "none"
    assert infos["expected-attention"]["cost"] == ("the last 512 queries before RoPE per layer and the values; "
                                                   "no CUDA graphs (a query window between steps)")
    assert infos["sink-rerotate"]["cost"] == ("the kept keys re-rotated after every eviction; "
                                              "no CUDA graphs (re-rotation)")
    assert infos["pyramidkv"]["cost"] == ("attention rows of the last 32 queries; no CUDA graphs (per-layer budgets)")
    assert infos["pyramidkv"]["per_layer_budgets"] and not infos["snapkv"]["per_layer_budgets"]
    res = runner.invoke(app, ["policies"], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "extra cost" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("snapkv "))
    assert line.rstrip().endswith("attention rows of the last 32 queries")
