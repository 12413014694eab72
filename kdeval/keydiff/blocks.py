"""``torch.compile`` for the parts of a decoder layer that never touch the cache: its RMSNorms, its MLP and the
rotary embedding. Eager, each is a handful of small kernels (an RMSNorm is about six, the rotary embedding
about ten per layer); compiled, one or two. In a captured chunk step of a small chunk those kernels, not
their arithmetic, are what costs (see bench/step_ops.py).

The model is not changed: :meth:`CompiledBlocks.active` routes those modules' ``forward`` (and the modeling
module's ``apply_rotary_pos_emb``) through one compiled function per process while the engine's step runs,
then puts everything back. The compiled function's guards are on the module's class and settings, not on the
instance, so every layer shares it.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Iterator

import torch

from kdeval.keydiff.compiling import compile_fn

#: class-name endings of the modules compiled (Llama, Qwen2, Mistral, ... name them this way)
COMPILED_MODULES = ("RMSNorm", "MLP")


def _call(module: torch.nn.Module, *args, **kwargs):
    return type(module).forward(module, *args, **kwargs)


@functools.cache
def _compiled_call():
    return compile_fn(_call)


@functools.cache
def _compiled_function(fn):
    return compile_fn(fn)


class CompiledBlocks:
    """The cache-free blocks of one model, compiled while :meth:`active`."""

    def __init__(self, model: torch.nn.Module):
        self.modules = [m for m in model.modules() if type(m).__name__.endswith(COMPILED_MODULES)]
        if not self.modules:
            raise ValueError(f"compile_blocks: {type(model).__name__} has no module named *RMSNorm or *MLP")
        self.modeling = sys.modules[type(model).__module__]
        self.rope = getattr(self.modeling, "apply_rotary_pos_emb", None)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        call = _compiled_call()
        before = [m.__dict__.get("forward") for m in self.modules]  # an instance-level forward set by others
        for m in self.modules:
            m.forward = functools.partial(call, m)
        if self.rope is not None:
            self.modeling.apply_rotary_pos_emb = _compiled_function(self.rope)
        try:
            yield
        finally:
            for m, forward in zip(self.modules, before):
                if forward is None:
                    del m.forward
                else:
                    m.forward = forward
            if self.rope is not None:
                self.modeling.apply_rotary_pos_emb = self.rope
