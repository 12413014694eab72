"""`kdeval generate` and `kdeval policies`: try one policy on one prompt; list the registered policies."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kdeval.cli.errors import bad_input

console = Console()


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
        store: str = typer.Option("slot", help="KV store: slot (in place, default) or gather (reference)"),
        dtype: str = typer.Option("float32", help="float32, bfloat16 or float16"),
        device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
        chat: bool = typer.Option(True, help="wrap the prompt in the model's chat template when it has one"),
        graphs: Optional[bool] = typer.Option(None, "--graphs/--no-graphs",
                                              help="CUDA graphs for the chunk and decode steps (default: on with CUDA)"),
        fuse_layers: bool = typer.Option(False, help="with graphs: score and evict all layers at once"),
        compile_scoring: bool = typer.Option(False,
                                             help="with graphs: compile the policy's scoring (torch.compile)"),
        compile_blocks: bool = typer.Option(False, help="with graphs: compile the layers' norms, MLP and rotary"),
        attention_splits: int = typer.Option(0, help="with graphs: attend to a full cache in this many key splits"),
        flex_attention: bool = typer.Option(False, help="with graphs: FlexAttention, skipping empty cache slots"),
        score_precision: str = typer.Option("model", help="TOVA/SnapKV/H2O logits in a half-precision model: "
                                                          "model (its precision) or float32"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Run one prompt through the chunked engine and print the answer and the run's stats."""
        from kdeval.baselines import get_policy
        from kdeval.keydiff import Engine, EngineConfig, load_model

        with bad_input():
            if (prompt is None) == (prompt_file is None):
                raise ValueError("prompt: give exactly one of --prompt or --prompt-file")
            if prompt_file is not None and not prompt_file.is_file():
                raise ValueError(f"--prompt-file: no such file: {prompt_file}")
            text = prompt if prompt is not None else prompt_file.read_text()
            pol = get_policy(policy, **parse_params(param))
            config = EngineConfig(budget=budget, chunk_size=chunk, max_new_tokens=max_new_tokens, store=store,
                                  cuda_graphs=graphs, fuse_layers=fuse_layers, compile_scoring=compile_scoring,
                                  compile_blocks=compile_blocks, attention_splits=attention_splits,
                                  flex_attention=flex_attention,
                                  score_precision=score_precision)
            lm = load_model(model, dtype=dtype, device=device)
            ids = build_prompt_ids(lm.tokenizer, text, chat)
            engine = Engine(lm.model, pol, config)
            result = engine.generate(ids, eos_token_id=lm.eos_token_ids)  # every eos id the model declares
        answer = lm.tokenizer.decode(result.tokens[0], skip_special_tokens=True)
        stats = result.stats.to_dict()
        eviction = ("no eviction (full cache)" if not engine.evicting
                    else f"{policy} keeps N={budget} tokens per layer and KV head, chunks of B={chunk}")
        if as_json:
            print(json.dumps({"model": model, "policy": policy, "params": pol.params(), "budget": budget,
                              "chunk": chunk, "eviction": eviction, "answer": answer, "stats": stats}))
            return
        console.print(f"[bold]{eviction}[/bold]")
        console.print(f"[bold]answer[/bold]: {answer}")
        table = Table(show_header=False)
        for k, v in stats.items():
            table.add_row(k, f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
        console.print(table)

    @app.command()
    def policies(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """List every registered eviction policy with its rule and parameters."""
        from kdeval.baselines import list_policies

        infos = list_policies()
        if as_json:
            print(json.dumps([i.to_dict() for i in infos], indent=2))
            return
        table = Table("policy", "rule", "parameters (default)", "attention")
        for i in infos:
            params = ", ".join(f"{p.name}={p.default!r}" for p in i.params) or "-"
            table.add_row(i.name, i.rule, params, "yes" if i.needs_attention else "no")
        console.print(table)
