"""Why a policy does not run on a model's layers, in one line each: what an MLA cache does not hold, what windowed
or recurrent layers do not share, a RoPE that turns only part of each head. :func:`~kdeval.keydiff.plan.plan.make_plan`
raises them when an engine is built and the grid's submit-time check (kdeval/jobs/grid/fit.py) says them alike, so
this module imports only the policy interface (validating a grid loads no transformers).
"""
from __future__ import annotations

from kdeval.keydiff.policy.interface import PolicyNeeds


#: what a policy may read that an MLA cache does not hold as such
_LATENT_REFUSED = (("values", "reads the cached values"), ("projections", "reads the layer's attention projections"),
                   ("queries", "scores with the layer's queries and keys"), ("rerotates", "re-rotates its kept keys"),
                   ("shares_heads", "shares a layer's slots among its KV heads"),
                   ("edits_kept_keys", "edits key channels"), ("merges", "merges freed values into kept ones"),
                   ("repeat", "scores a repeat pass"))


def latent_refusal(needs: PolicyNeeds) -> str | None:
    """Why a policy of ``needs`` cannot run on a multi-head latent attention (MLA) cache, whose rows are one latent
    and one shared rotary key a token, not per-head keys and values (``None``: it can); make_plan and the grid's
    submit-time check (kdeval/jobs/grid/fit.py) say it alike."""
    for flag, what in _LATENT_REFUSED:
        if getattr(needs, flag) not in (None, False):
            return (f"{what}, which a multi-head latent attention (MLA) cache does not hold (it keeps one compressed "
                    f"latent and one shared rotary key a token)")
    return None


def recurrent_refusal(needs: PolicyNeeds) -> str | None:
    """Why a policy of ``needs`` does not run beside recurrent layers (``None``: it does), as
    :func:`latent_refusal`."""
    why = ("shares a layer's slots among its KV heads" if needs.shares_heads
           else "re-rotates its kept keys to contiguous positions" if needs.rerotates
           else "scores a repeat pass over the cache, which a recurrent state cannot be rewound for"
           if needs.repeat is not None
           else "reads every decoder layer's attention queries" if needs.queries is not None
           else "reads every decoder layer's attention projections" if needs.projections else None)
    if why is None:
        return None
    return f"{why}; not supported on a model with recurrent (linear-attention, Mamba or conv) layers"


def partial_rotary_refusal(needs: PolicyNeeds, config) -> str | None:
    """Why a policy of ``needs`` does not run on a model whose RoPE turns only part of each head (Qwen3.5's and
    Qwen3-Next's ``partial_rotary_factor`` 0.25), as :func:`latent_refusal`; ``None``: it runs."""
    rope = getattr(config, "rope_parameters", None) or {}
    factor = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    factor = factor if factor is not None else getattr(config, "partial_rotary_factor", 1.0)
    if factor is None or factor >= 1 or (needs.queries is None and not needs.rerotates):
        return None
    what = "rotates queries ahead" if needs.queries is not None else "re-rotates its kept keys"
    return f"{what} over whole heads; the model's RoPE turns {factor:g} of each head (partial_rotary_factor)"


def windowed_refusal(needs: PolicyNeeds) -> str | None:
    """Why a policy of ``needs`` does not run beside windowed layers (``None``: it does), as :func:`latent_refusal`."""
    why = ("shares a layer's slots among its KV heads" if needs.shares_heads
           else "re-rotates its kept keys to contiguous positions, which windowed layers do not share"
           if needs.rerotates else "scores a repeat pass" if needs.repeat is not None else None)
    if why is None:
        return None
    return f"{why}; not supported on a model with windowed (sliding or chunked) attention layers"
