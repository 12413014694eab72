"""`make demo`: chunked KeyDiff on the real offline SmolLM2 with a needle hidden in ~2K tokens of essays.

Prints the answer, the kept-cache size and peak memory for the full cache and two KeyDiff budgets.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kdeval.keydiff import Engine, EngineConfig, get_policy, load_model

NEEDLE = "The special magic number for Kyoto is 4817263."
QUESTION = "What is the special magic number for Kyoto mentioned in the text above?"
ANSWER_PREFIX = "The special magic number for Kyoto mentioned in the text is"
EXPECTED = "4817263"


def needle_prompt(tokenizer, data_dir: Path, context_tokens: int = 2000, depth: float = 0.5):
    """Token ids ``[1, L]``: essays cut to ``context_tokens`` with the needle at ``depth``, chat-formatted."""
    essays = data_dir / "haystack" / "PaulGrahamEssays.json"
    if not essays.is_file():
        raise FileNotFoundError(f"haystack not found: {essays} (set KDEVAL_DATA_DIR to the data directory)")
    text = json.loads(essays.read_text())["text"]
    hay = tokenizer.decode(tokenizer(text[: context_tokens * 8]).input_ids[:context_tokens])
    cut = hay.rfind(". ", 0, int(len(hay) * depth)) + 2
    context = hay[:cut] + NEEDLE + " " + hay[cut:]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": f"{context}\n\n{QUESTION}"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    prefix = tokenizer(ANSWER_PREFIX, return_tensors="pt").input_ids
    import torch

    return torch.cat([ids, prefix], dim=1)


def main() -> None:
    console = Console(width=150)
    data_dir = Path(os.environ.get("KDEVAL_DATA_DIR", "data"))
    console.print("loading smollm2-135m (first run converts the GGUF, ~25 s) ...")
    lm = load_model("smollm2-135m", device="cpu")
    ids = needle_prompt(lm.tokenizer, data_dir)
    table = Table("policy", "budget N", "chunk B", "answer", "found", "kept tokens", "peak KV tokens",
                  "KV cache MiB", "peak RSS MiB", "TTFT s", title=f"needle in {ids.shape[1]} tokens (SmolLM2-135M, CPU)")
    for policy, budget in (("full", None), ("keydiff", 1024), ("keydiff", 512)):
        engine = Engine(lm.model, get_policy(policy), EngineConfig(budget=budget, chunk_size=128))
        res = engine.generate(ids, max_new_tokens=10, eos_token_id=lm.eos_token_ids)
        answer = lm.tokenizer.decode(res.tokens[0], skip_special_tokens=True).strip()
        s = res.stats
        table.add_row(policy, str(budget or "-"), "128", answer, "yes" if EXPECTED in answer else "no",
                      str(s.kept_tokens), str(s.peak_kv_tokens), f"{s.kv_cache_bytes / 2**20:.1f}",
                      f"{s.peak_memory_bytes / 2**20:.0f}", f"{s.ttft_s:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
