"""What the engine checks before it runs: that a state can be continued by it, and the policy's per-layer budgets."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kdeval.keydiff.headpool import HeadPoolCache

if TYPE_CHECKING:
    from kdeval.keydiff.engine import Engine
    from kdeval.keydiff.policy import Policy
    from kdeval.keydiff.state import PrefillState


def check_continuable(engine: "Engine", state: "PrefillState") -> None:
    """Refuse (``ValueError`` naming ``state``) a state this engine cannot continue: released, laid out for other
    graph/store settings, rotated at the other positions, of the other cache kind, or without the per-token
    state the policy keeps."""
    state.check_usable()
    layout = engine.config.budget if engine.use_graphs else None
    if state.cache.static_base != layout and not (
            state.cache.static_base is None and state.cache.thawed_from == layout):
        raise ValueError("state: its cache was laid out by an engine with other graph/store settings; "
                         "continue it with the engine that made it")
    if state.cache.rerotated != engine.rerotate and state.cache.length < state.seen:
        raise ValueError("state: its kept keys are rotated at " + ("contiguous" if state.cache.rerotated else
                         "their absolute") + f" positions, policy '{engine.policy.name}' expects "
                         + ("contiguous" if engine.rerotate else "absolute") + " ones; continue it with the policy "
                         "that made it")
    if isinstance(state.cache, HeadPoolCache) != engine.shares_heads:
        theirs, ours = ("does not share", "does") if engine.shares_heads else ("shares", "does not")
        raise ValueError(f"state: its cache {theirs} its slots among KV heads, policy '{engine.policy.name}' "
                         f"{ours}; continue it with the policy that made it")
    wanted = engine.policy_needs.token_state
    if set(wanted) - set(state.cache.state_names):
        raise ValueError(f"state: its cache keeps the per-token state {list(state.cache.state_names)}, policy "
                         f"'{engine.policy.name}' needs {list(wanted)}; continue it with the policy that made it")


def checked_layer_budgets(policy: "Policy", n: int, num_layers: int) -> list[int]:
    """The policy's per-layer budgets under budget ``n``, checked: one integer per layer, each holding the tokens
    the policy always keeps (``ValueError`` naming ``budget`` otherwise)."""
    policy.check_budget(n)
    budgets = policy.layer_budgets(n, num_layers)
    if len(budgets) != num_layers or not all(isinstance(b, int) and b > 0 for b in budgets):
        raise ValueError(f"budget: policy '{policy.name}' must give each of the {num_layers} layers a "
                         f"positive number of tokens, got {budgets!r}")
    for i, b in enumerate(budgets):
        try:
            policy.check_budget(b)
        except ValueError as e:
            raise ValueError(f"budget: layer {i} keeps {b} of N={n} tokens under policy '{policy.name}', "
                             f"{str(e).removeprefix('budget: ')}") from None
    return budgets
