"""One layer's attention in the static slot layout, every kernel the engine can use, checked then timed.

A chunk of ``t`` queries attends to the ``N`` head slots (``cached`` of them valid while the head fills) and
causally to its own ``t`` tail slots. The candidates:

Every candidate is the engine's own attention function, ``static_attention_forward``, given what the engine
gives it for that step:

- ``sdpa``: what the engine runs by default. A full head: SDPA with ``causal_lower_right`` and GQA. A filling
  head: SDPA with the engine's dense mask, the query heads of a KV head folded into the query axis.
- ``sdpa-flash`` / ``sdpa-efficient`` / ``sdpa-cudnn``: the same call held to one SDPA backend (full head).
- ``splitS``: ``attention_splits=S`` (full head).
- ``flex``: ``flex_attention=True`` (compiled FlexAttention with a block mask; skips empty head blocks).

Each is first compared with a float32 reference computed from the dense mask, then timed (CUDA events, or
wall time on the CPU). ``tflops`` counts only the visible query-key pairs, so a kernel that skips hidden keys
and one that masks them are compared on the same useful work.

    PYTHONPATH=. python bench/attention_kernels.py --out $OUT    # GPU: the 3B shape, bf16
    PYTHONPATH=. python bench/attention_kernels.py --cpu         # the cpu-tiny heads, N = 512, float32
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kdeval.keydiff.attention import static_attention_forward, static_mask
from kdeval.keydiff.flex_static import static_block_mask

sys.path.insert(0, str(Path(__file__).parent))
import engine_modes  # noqa: E402
from engine_modes import clock  # noqa: E402

SHAPES = {"cuda": ("llama-3.2-3b", 8192), "cpu": ("cpu-tiny", 512)}  # model shape, budget N
BACKENDS = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
            "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
LAYER = SimpleNamespace(layer_idx=0)


def reference(q, k, v, scale, mask) -> torch.Tensor:
    """float32 attention under the dense mask ``[1, 1, t, N + t]`` → ``[b, t, hq, d]``."""
    g = q.shape[1] // k.shape[1]
    kk, vv = (x.float().repeat_interleave(g, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def engine_attention(mask, backend=None, **options):
    """The engine's attention function (``static_attention_forward``) with what the engine passes it for the
    step: the dense mask while the head fills (else ``None``), ``kdeval_splits`` or ``kdeval_flex``;
    ``backend`` holds SDPA to one kernel → ``fn(q, k, v, scale)`` returning ``[b, t, hq, d]``."""

    def fn(q, k, v, scale):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return static_attention_forward(LAYER, q, k, v, mask, scaling=scale, **options)[0]

    return fn


def candidates(n: int, cached: int, t: int, group: int, device: str):
    """(name, fn(q, k, v, scale)) for one fill level; the masks are built outside the timed call, as the
    engine builds them once per step for all layers. Split counts always divide N here (else SDPA would run)."""
    full = cached >= n
    mask = None if full else static_mask(n, t, cached, torch.device(device), group)
    yield "sdpa", engine_attention(mask)
    if device == "cuda" and full:
        for name, backend in BACKENDS.items():
            yield name, engine_attention(mask, backend)
    if full:
        for splits in (4, 8, 16):
            yield f"split{splits}", engine_attention(None, kdeval_splits=splits)
    yield "flex", engine_attention(None, kdeval_flex=static_block_mask(n, t, cached, torch.device(device)))


@torch.inference_mode()
def run(device: str, dtype: torch.dtype, ts: list[int], reps: int, emit) -> None:
    shape, n = SHAPES[device]
    layout = engine_modes.SHAPES[shape]
    hq, hk, d = layout["num_attention_heads"], layout["num_key_value_heads"], layout["head_dim"]
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
            for name, fn in candidates(n, cached, t, hq // hk, device):
                row = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "t": t, "N": n,
                       "cached": cached, "kernel": name}
                try:
                    got = fn(q, k, v, scale)
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
        run(device, torch.bfloat16, [128, 1], 50, emit)
    else:
        run(device, torch.float32, [64, 1], 5, emit)
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (args.out / "attention_kernels.md").write_text(text)


if __name__ == "__main__":
    main()
