"""The engine's files one prefill chunk passes through, counted from the calls Python makes, not from reading.

A KeyDiff request alone on ``random:llama-tiny`` (CPU, float32, budget 64, chunk 32) is prefilled with a profile
hook on: the hook records every function call whose code lives under ``kdeval/`` during the prompt's third chunk (an
evicting step in steady state: the cache is full). Printed: the files in the order first entered, how many, and
how many times the call path crosses from one file into another. Run it on two trees to compare them:

    PYTHONPATH=../kdeval-before python bench/chunk_path.py
    PYTHONPATH=. python bench/chunk_path.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import kdeval
from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model

ROOT = Path(kdeval.__file__).resolve().parent
B, N = 32, 64


def main() -> None:
    torch.manual_seed(0)
    lm = load_model("random:llama-tiny", device="cpu")
    engine = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B))
    ids = torch.randint(10, lm.model.config.vocab_size - 1, (1, 3 * B))
    state = engine.prefill(ids[:, : 2 * B])  # two chunks: the cache holds N tokens and the next chunk evicts
    files: list[str] = []
    crossings = 0
    stack: list[str] = []

    def hook(frame, event, arg):
        nonlocal crossings
        if event not in ("call", "return"):
            return
        path = Path(frame.f_code.co_filename).resolve()
        if ROOT not in path.parents:
            return
        name = str(path.relative_to(ROOT.parent))
        if event == "return":
            if stack:
                stack.pop()
            return
        if stack and stack[-1] != name:
            crossings += 1
        stack.append(name)
        if name not in files:
            files.append(name)

    sys.setprofile(hook)
    try:
        engine.prefill(ids[:, 2 * B :], state)
    finally:
        sys.setprofile(None)
    print("\n".join(files))
    print(f"\n{len(files)} files under kdeval/ (the model's own transformers files not counted); "
          f"{crossings} calls cross into another file")


if __name__ == "__main__":
    main()
