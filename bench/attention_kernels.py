"""One layer's attention in the static slot layout, every kernel the engine can use, checked then timed.

A chunk of ``t`` queries attends to the ``N`` head slots (``cached`` of them valid while the head fills) and
causally to its own ``t`` tail slots. The candidates:

- ``sdpa``: what the engine runs by default. A full head: SDPA with ``causal_lower_right`` and GQA. A filling
  head: SDPA with the engine's dense mask, the query heads of a KV head folded into the query axis.
- ``sdpa-flash`` / ``sdpa-efficient`` / ``sdpa-cudnn``: the same call held to one SDPA backend (full head).
- ``splitS``: ``attention_splits=S`` (full head).
- ``flex``: ``flex_attention=True`` (compiled FlexAttention with a block mask; skips empty head blocks).

Each is first compared with a float32 reference computed from the dense mask, then timed (CUDA events, or
wall time on the CPU). ``tflops`` counts only the visible query-key pairs, so a kernel that skips hidden keys
and one that masks them are compared on the same useful work.

    PYTHONPATH=. python bench/attention_kernels.py --out $OUT    # GPU: the 3B shape, bf16
    PYTHONPATH=. python bench/attention_kernels.py --cpu         # small shapes, float32
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
import traceback
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from kdeval.keydiff.attention import static_mask
from kdeval.keydiff.flex_static import flex_static_attention, static_block_mask
from kdeval.keydiff.split_attention import split_kv_attention

SHAPES = {  # q heads, kv heads, head size, budget N
    "llama-3.2-3b": (24, 8, 128, 8192),
    "cpu-small": (6, 2, 32, 512),
}
BACKENDS = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
            "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}


def reference(q, k, v, scale, mask) -> torch.Tensor:
    """float32 attention under the dense mask ``[1, 1, t, N + t]`` → ``[b, t, hq, d]``."""
    g = q.shape[1] // k.shape[1]
    kk, vv = (x.float().repeat_interleave(g, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def sdpa(q, k, v, scale, n, cached, backend=None):
    """The engine's SDPA path (attention.static_attention_forward) → ``[b, t, hq, d]``."""
    b, hq, t, d = q.shape
    hk = k.shape[1]
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        if cached >= n:
            bias = causal_lower_right(t, n + t) if t > 1 else None
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale,
                                                                   enable_gqa=True)
            return out.transpose(1, 2)
        mask = static_mask(n, t, cached, q.device, hq // hk)
        out = torch.nn.functional.scaled_dot_product_attention(q.reshape(b, hk, hq // hk * t, d), k, v,
                                                               attn_mask=mask, scale=scale)
        return out.view(b, hq, t, -1).transpose(1, 2)


def candidates(n: int, cached: int, t: int, device: str):
    """(name, fn(q, k, v, scale)) for one fill level; the block mask is built outside the timed call, as the
    engine builds it once per step for all layers."""
    yield "sdpa", lambda q, k, v, s: sdpa(q, k, v, s, n, cached)
    if device == "cuda" and cached >= n:
        for name, backend in BACKENDS.items():
            yield name, (lambda be: lambda q, k, v, s: sdpa(q, k, v, s, n, cached, be))(backend)
    if cached >= n:
        for splits in (4, 8, 16):
            yield f"split{splits}", (lambda S: lambda q, k, v, s: split_kv_attention(q, k, v, s, S))(splits)
    block_mask = static_block_mask(n, t, cached, torch.device(device))
    yield "flex", lambda q, k, v, s: flex_static_attention(q, k, v, s, block_mask)


def clock(fn, device: str, reps: int) -> float:
    """Seconds per call (after two warm-up calls)."""
    for _ in range(2):
        fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


@torch.inference_mode()
def run(shape: str, device: str, dtype: torch.dtype, ts: list[int], reps: int, emit) -> None:
    hq, hk, d, n = SHAPES[shape]
    g = torch.Generator(device).manual_seed(0)
    scale = d ** -0.5
    for t in ts:
        q = torch.randn(1, hq, t, d, device=device, dtype=dtype, generator=g)
        k = torch.randn(1, hk, n + t, d, device=device, dtype=dtype, generator=g)
        v = torch.randn(1, hk, n + t, d, device=device, dtype=dtype, generator=g)
        for cached in (n // 4, n // 2, 3 * n // 4, n):
            mask = static_mask(n, t, cached, q.device)
            want = reference(q, k, v, scale, mask)
            pairs = int(mask.sum())  # visible query-key pairs of one query head
            for name, fn in candidates(n, cached, t, device):
                row = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "t": t, "N": n,
                       "cached": cached, "kernel": name}
                try:
                    got = fn(q, k, v, scale)
                    if got is None:
                        emit({**row, "skipped": "declined"})
                        continue
                    err = float((got.float() - want).abs().max())
                    sec = clock(lambda: fn(q, k, v, scale), device, reps)
                    emit({**row, "max_abs_err": err, "us": sec * 1e6, "tflops": 4 * pairs * d * hq / sec / 1e12})
                except Exception as e:  # noqa: BLE001 - recorded, the other kernels still run
                    traceback.print_exc()
                    emit({**row, "error": repr(e)[:300]})


def table(rows: list[dict]) -> str:
    lines = ["| t | cached / N | kernel | µs | TFLOP/s (visible pairs) | max abs err vs float32 |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "us" in r:
            lines.append(f"| {r['t']} | {r['cached']} / {r['N']} | {r['kernel']} | {r['us']:.1f} | "
                         f"{r['tflops']:.3g} | {r['max_abs_err']:.2e} |")
        else:
            lines.append(f"| {r['t']} | {r['cached']} / {r['N']} | {r['kernel']} | - | - | "
                         f"{r.get('error') or r.get('skipped')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="small shapes in float32 on the CPU")
    ap.add_argument("--out", type=Path, default=None, help="directory for attention_kernels.jsonl and .md")
    args = ap.parse_args()
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    rows: list[dict] = []

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        rows.append(row)

    if device == "cuda":
        run("llama-3.2-3b", device, torch.bfloat16, [128, 1], 50, emit)
    else:
        run("cpu-small", device, torch.float32, [64, 1], 5, emit)
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (args.out / "attention_kernels.md").write_text(text)


if __name__ == "__main__":
    main()
