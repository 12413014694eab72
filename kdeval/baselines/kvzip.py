"""KVzip (Kim et al. 2025, arXiv 2505.23416; kvpress' ``KVzipPress``): query-agnostic scores from context
reconstruction.

After the compressed tokens' forward the model is fed a repeat prompt, "Repeat the previous context exactly." in
the chat template's form, then those tokens again, over the cache (one extra forward, in pieces of at most
``repeat_chunk`` tokens; kdeval/keydiff/attention/repeat_prompt.py, kdeval/keydiff/step/repeat_pass.py). A cached token's score is the
largest attention any repeated token pays it, over the query heads of its KV head, each query's softmax taken over
the first ``n_sink_tokens`` positions, the piece being reconstructed and the repeat's own tokens. The first
``n_sink_tokens`` positions are always kept; the chat template's head at the start of a prompt (its system prompt)
is not reconstructed and scores 0. The repeat's keys and values never enter the cache. Cost: one forward over the repeat
prompt and the compressed tokens, 2-3x a prefill (rows count its tokens in ``extra_forward_tokens``, its time in
``ttft_s``).

Budgets: kdeval keeps the best ``N`` per (layer, KV head). kvpress shares a budget instead: by default across all
layers and heads (``layerwise=False``), with ``layerwise=True`` across a layer's heads; kdeval's per-layer budgets
are fixed before the first step, and its head-shared pool (AdaKV) keeps no per-token state, so ``ada`` cannot wrap
``kvzip`` either (bench/RESULTS.md's parity section measures both against kvpress). ``kvzip_plus_normalization`` is
not implemented.

Chunk by chunk (any ``B``), each evicting prompt step reconstructs its own chunk right after its forward, over the
cache as held then (the survivors of earlier chunks and the chunk); a later chunk's instruction is "Repeat the part
of the previous context exactly, starting with" and the 8 tokens before it, as for kvpress' later pieces. A token's
score is fixed by its own chunk's reconstruction, so the extra cost stays one forward over the prompt (plus each
chunk's instruction). In one chunk this is kvpress' rule exactly. Tokens never reconstructed (the question under
``compress: context``, which is protected anyway, and decoded tokens) rank above every reconstructed one: eviction
while decoding frees the lowest-scored context token first, then the oldest decoded token. Under
``compress: prompt`` the question is reconstructed with the context and competes with it for ``N``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register
from kdeval.keydiff.attention.repeat_prompt import RepeatNeed

#: the score of a token no repeat pass reconstructed: above every attention probability
UNSCORED = 2.0


@register
@dataclass
class KVzip(Policy):
    name = "kvzip"
    rule = ("keep the tokens the model attends to most while it repeats the context: the largest attention from any "
            "repeated token and query head of the KV head (KVzip)")

    n_sink_tokens: int = 4
    repeat_chunk: int = 2048

    def validate(self) -> None:
        for name, least in (("n_sink_tokens", 0), ("repeat_chunk", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"{name}: must be an integer >= {least}, got {v!r}")

    def needs(self) -> PolicyNeeds:
        """A repeat pass; its scores kept per token (``kvzip``), tied scores evicted oldest first."""
        return PolicyNeeds(repeat=RepeatNeed(n_sink=self.n_sink_tokens, chunk=self.repeat_chunk),
                           token_state=("kvzip",), exact_ties=True)

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def observe(self, ctx: ScoreContext) -> None:
        """Write the step's chunk's scores ``[b, hk, n_new]`` into its tokens' state (``UNSCORED`` without a repeat
        pass)."""
        new = ctx.state["kvzip"][..., ctx.state["kvzip"].shape[-1] - ctx.n_new :]
        if ctx.repeat is None:
            new.fill_(UNSCORED)
        else:
            new.copy_(ctx.repeat)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``[b, hk, n]``: each cached token's score from its repeat pass."""
        return ctx.state["kvzip"]
