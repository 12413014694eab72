"""What the GPU benchmarks share: the random-weight model shapes they build and the engine modes they name
(``"graphs-fp32scores"``, ``"static-eager+reused"``, ...), and a timer. Used by gpu_check.py,
gpu_profile.py and tie_selection.py; needs only torch and transformers.
"""
from __future__ import annotations

SHAPES = {
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "cpu-tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=16, vocab_size=512),
    # the 3B layer count and head layout with tiny widths: operators per step as at the 3B shape (step_ops.py)
    "3b-layout-tiny": dict(hidden_size=96, intermediate_size=128, num_hidden_layers=28, num_attention_heads=24,
                           num_key_value_heads=8, head_dim=8, vocab_size=512),
}
#: a mode suffix: the request runs on a cache (and graphs) released by an earlier request of the same engine
REUSED = "+reused"
BASES = ("plain", "graphs", "static-eager")
OPTIONS = ("fp32scores",)


def build(shape: str, device: str, dtype, layers: int | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    params = dict(SHAPES[shape])
    if layers:
        params["num_hidden_layers"] = layers
    config = LlamaConfig(**params, max_position_embeddings=131072, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def engine_kwargs(name: str, budget: int, B: int, mode: str, store: str = "slot", device: str = "cuda") -> dict:
    """The keyword arguments of ``Engine(model, policy, **kwargs)`` for policy ``name`` in ``mode``: its
    ``config`` and the test oracles it plugs in (tests/keydiff/oracles.py): ``store="gather"``, the gather store;
    "static-eager" (and every mode on a CPU), the graph path emulated with plain calls.

    ``mode``: "plain", "graphs" (captured; emulated on the CPU) or "static-eager" (the same step, uncaptured),
    the last two with a "-fp32scores" suffix for ``score_precision="float32"`` (TOVA, SnapKV and H2O's captured logits in float32, as before that option
    existed); a trailing :data:`REUSED` is handled by the caller."""
    from kdeval.keydiff import EngineConfig
    from tests.keydiff.oracles import EMULATED, STORES  # run from the repository root (PYTHONPATH=.)

    base, *options = mode.removesuffix(REUSED).split("-")
    if base == "static":  # "static-eager"
        base, options = "static-eager", options[1:]
    unknown = [o for o in options if o not in OPTIONS]
    if base not in BASES or unknown:
        raise ValueError(f"mode: expected one of {BASES} with options from {OPTIONS}, got {mode!r}")
    config = EngineConfig(budget=None if name == "full" else budget, chunk_size=B,
                          cuda_graphs=base in ("graphs", "static-eager") and name != "full",
                          score_precision="float32" if "fp32scores" in options else "model")
    emulated = EMULATED if base == "static-eager" or device == "cpu" else {}
    return dict(config=config, **STORES[store], **emulated)


def clock(fn, device: str, reps: int, warmup: int = 2) -> float:
    """Mean seconds per call of ``fn`` over ``reps`` calls after ``warmup`` (CUDA events on a GPU)."""
    import time

    import torch

    for _ in range(warmup):
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
