"""`kdeval generate` and `kdeval policies`: try one policy on one prompt; list the registered policies.

torch and transformers are imported when ``generate`` runs, not for ``--help``. Unless ``--verbose``,
third-party warnings, log lines and progress bars (weights loading, tokenizer notices, transformers'
"Token indices sequence length" line) are kept off the terminal: kdeval's own words come first.
"""
from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdeval.cli.consoles import stdout
from kdeval.cli.errors import bad_input
from kdeval.cli.plugin_opts import load_cli_plugins, plugin_option
from kdeval.untrusted import UntrustedFileError, read_text

#: The longest --prompt-file read (a million-token prompt is a few MB).
MAX_PROMPT_BYTES = 256 << 20


def _prompt_text(path: Path) -> str:
    """The prompt file's text: a regular file of at most :data:`MAX_PROMPT_BYTES` (a FIFO or a device is
    refused, not waited on), one line naming it otherwise."""
    try:
        return read_text(path, MAX_PROMPT_BYTES)
    except UntrustedFileError as e:
        raise ValueError(f"--prompt-file: {e}") from None


#: How the stats of ``generate`` are printed: (label, kind of :mod:`kdeval.jobs.reports.render.units`).
STAT_LABELS: dict[str, tuple[str, str]] = {
    "prompt_tokens": ("prompt tokens", "prompt_tokens"), "ttft_s": ("TTFT s", "ttft_median_s"),
    "decode_s": ("decode s", "ttft_median_s"), "decode_tokens": ("decode tokens", "peak_kv_tokens"),
    "decode_tokens_per_s": ("decode tok/s", "decode_tok_s"), "peak_kv_tokens": ("peak KV tokens", "peak_kv_tokens"),
    "kept_tokens": ("kept tokens", "peak_kv_tokens"), "kv_cache_bytes": ("KV cache", "peak_kv_bytes"),
    "peak_kv_bytes": ("peak KV cache", "peak_kv_bytes"), "peak_memory_bytes": ("peak memory", "peak_memory_bytes"),  # labelled by its memory_kind
    "extra_forward_tokens": ("extra forward tokens (in TTFT)", "peak_kv_tokens"),
    "windowed_kv_bytes": ("of which windowed layers", "peak_kv_bytes"), "layer_kinds": ("layers", ""),
    "state_bytes": ("recurrent states (beside the KV cache)", "peak_kv_bytes"),
    "kv_buffer_bytes": ("KV buffers allocated", "peak_kv_bytes"),
}


@contextlib.contextmanager
def third_party_quiet(verbose: bool = False) -> Iterator[None]:
    """Keep transformers', huggingface_hub's and Python's warnings, log lines and progress bars off the terminal
    (``verbose``: leave them as they are). Errors still raise."""
    if verbose:
        yield
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def stats_table(stats: dict[str, Any]) -> Table:
    """The run's stats with units: seconds and rates to 3 significant digits, token counts as integers,
    bytes in MiB or GiB (the unit in the label)."""
    from kdeval.jobs.reports.report_rows import memory_label
    from kdeval.jobs.reports.render.units import bytes_unit, text

    table = Table(show_header=False)
    for key, value in stats.items():
        if key == "memory_kind" or (key in ("replayed_steps", "extra_forward_tokens", "windowed_kv_bytes",
                                            "layer_kinds", "state_bytes") and not value):
            # one call shares no steps; only a repeat-pass policy (KVzip) runs extra forwards; only a model with
            # windowed layers (recurrent layers) has them
            continue
        label, field = STAT_LABELS.get(key, (key, ""))
        if key == "peak_memory_bytes":
            label = memory_label(stats.get("memory_kind") or "")
        if field.endswith("_bytes") and value is not None:
            unit, div = bytes_unit([value])
            table.add_row(f"{label} {unit}", text(value, field, div))
        else:
            table.add_row(label, text(value, field) if field else str(value))
    return table


def parse_params(items: list[str]) -> dict[str, str]:
    """``["window=32", "pool=max"]`` → dict; a malformed item is bad input naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def build_prompt_ids(tokenizer, text: str, chat: bool):
    """Token ids ``[1, L]`` for ``text``, through the chat template when asked and the tokenizer has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        return ids
    return tokenizer(text, return_tensors="pt").input_ids


def register(app: typer.Typer) -> None:
    @app.command()
    def generate(
        model: str = typer.Option("smollm2-135m", help="model name: smollm2-135m, random:llama-tiny, a hub id or path"),
        policy: str = typer.Option("keydiff", help="eviction policy (see `kdeval policies`)"),
        budget: Optional[int] = typer.Option(None, help="N: tokens kept per layer per KV head (omit: no eviction)"),
        chunk: int = typer.Option(128, help="B: prefill chunk size"),
        prompt: Optional[str] = typer.Option(None, help="prompt text"),
        prompt_file: Optional[Path] = typer.Option(None, help="read the prompt from this file"),
        max_new_tokens: int = typer.Option(64, help="tokens to generate"),
        param: list[str] = typer.Option([], "--param", help="policy parameter key=value (repeatable)"),
        dtype: str = typer.Option("float32", help="float32, bfloat16 or float16"),
        device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
        chat: bool = typer.Option(True, help="wrap the prompt in the model's chat template when it has one"),
        graphs: Optional[bool] = typer.Option(None, "--graphs/--no-graphs",
                                              help="CUDA graphs for the chunk and decode steps (default: on with CUDA)"),
        score_precision: str = typer.Option("model", help="TOVA/SnapKV/H2O logits in a half-precision model: "
                                                          "model (its precision) or float32"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        verbose: bool = typer.Option(False, "--verbose", help="let third-party warnings and progress bars through"),
        plugin: list[str] = plugin_option(),
    ) -> None:
        """Run one prompt through the chunked engine and print the answer and the run's stats."""
        load_cli_plugins(plugin)
        from kdeval.baselines import get_policy
        from kdeval.keydiff import Engine, EngineConfig
        from kdeval.zoo import load_model
        from kdeval.keydiff.attention.repeat_prompt import RepeatPrompt

        with third_party_quiet(verbose):
            with bad_input():
                if (prompt is None) == (prompt_file is None):
                    raise ValueError("prompt: give exactly one of --prompt or --prompt-file")
                if prompt_file is not None and not (prompt_file.exists() or prompt_file.is_symlink()):
                    raise ValueError(f"--prompt-file: no such file: {prompt_file}")
                text = prompt if prompt is not None else _prompt_text(prompt_file)
                pol = get_policy(policy, **parse_params(param))
                config = EngineConfig(budget=budget, chunk_size=chunk, max_new_tokens=max_new_tokens,
                                      cuda_graphs=graphs, score_precision=score_precision)
                lm = load_model(model, dtype=dtype, device=device)
                ids = build_prompt_ids(lm.tokenizer, text, chat)
                repeat = RepeatPrompt.from_tokenizer(lm.tokenizer) if pol.evicts and pol.needs().repeat else None
                engine = Engine(lm.model, pol, config, repeat_prompt=repeat)
                result = engine.generate(ids, eos_token_id=lm.eos_token_ids)  # every eos id the model declares
            answer = lm.tokenizer.decode(result.tokens[0], skip_special_tokens=True)
        stats = result.stats.to_dict()
        eviction = ("no eviction (full cache)" if not engine.plan.evicting
                    else f"{policy} keeps N={budget} tokens per layer and KV head, chunks of B={chunk}")
        if as_json:
            print(json.dumps({"model": model, "policy": policy, "params": pol.params(), "budget": budget,
                              "chunk": chunk, "eviction": eviction, "answer": answer, "stats": stats}))
            return
        console = stdout()
        console.print(eviction, style="bold", markup=False, highlight=False)
        console.print(f"[bold]answer[/bold]: {escape(answer)}", highlight=False)
        console.print(stats_table(stats))

    PROTOCOLS_NOTE = ("Every policy runs under two protocols (grid `protocol:`, one or a list): query-aware "
                      "(compress: prompt, the question is compressed with the context: the KeyDiff paper's, kvpress's "
                      "query_aware) and query-agnostic (compress: context, only the context is compressed and the "
                      "question is kept: kvpress's default). Chunk size `whole` compresses once after a full prefill.")

    @app.command()
    def policies(as_json: bool = typer.Option(False, "--json", help="print JSON"),
                 plugin: list[str] = plugin_option()) -> None:
        """List every registered eviction policy with its rule, parameters and extra cost.

        The extra cost (attention rows, per-token state, no CUDA graphs) comes from what each policy says its
        scores need, at its default parameters. A policy from a plugin says where it came from."""
        from kdeval.baselines import list_policies
        from kdeval.cluster.plugins import policy_origin

        load_cli_plugins(plugin)
        infos = list_policies()
        if as_json:
            print(json.dumps([{**i.to_dict(), "origin": policy_origin(i.name)} for i in infos], indent=2))
            return
        from kdeval.jobs.reports.render.layout import Column, TableView, render

        rows = [[i.name, i.rule, ", ".join(f"{p.name}={p.default!r}" for p in i.params) or "-", i.cost]
                for i in infos]
        columns = [Column("policy", key=True), Column("rule", fold=True), Column("parameters (default)"),
                   Column("extra cost (defaults)", fold=True)]
        if any(policy_origin(i.name) != "built-in" for i in infos):  # the built-in listing stays as it was
            columns.append(Column("from", key=True))
            rows = [row + [policy_origin(i.name)] for row, i in zip(rows, infos)]
        view = TableView("policies", f"{len(infos)} policies (`--policy NAME --param key=value`)", columns, rows)
        console = stdout()
        console.print(render(view, console.width))
        console.print(PROTOCOLS_NOTE, highlight=False, soft_wrap=True)
        from kdeval.keydiff.quant.rule import EXPLANATION

        console.print(EXPLANATION, highlight=False, soft_wrap=True)
