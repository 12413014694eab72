"""What a plugin's policy class must be before it is registered: a dataclass with a name, buildable at its
defaults, with a score; and a one-step probe through the engine on a tiny random model that checks its scores'
shape (kdeval/cluster/plugins.py calls both for every policy a plugin defines)."""
from __future__ import annotations

import dataclasses
from typing import Any

from kdeval.cluster.plugin_types import PluginError, one_line as _one_line


def check_policy_class(cls: type, ref: str) -> None:
    """A plugin's policy class must be a dataclass with a name, buildable at its defaults, with a score."""
    from kdeval.keydiff.policy.interface import Policy

    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name or any(ch.isspace() for ch in name):
        raise PluginError(f"plugin {ref}: policy class {cls.__name__}: expected a class attribute `name`, "
                          f"a non-empty name without spaces, got {name!r}")
    if not dataclasses.is_dataclass(cls):
        raise PluginError(f"plugin {ref}: policy '{name}': expected a @dataclass (its parameters are its fields)")
    if cls.evicts and cls.score is Policy.score:
        raise PluginError(f"plugin {ref}: policy '{name}': expected a score(keys, ctx) method")
    try:
        cls()
    except Exception as e:  # noqa: BLE001 - the user's validate()
        raise PluginError(f"plugin {ref}: policy '{name}': cannot be built at its defaults: {_one_line(e)}") from None


#: the one-step probe's model, prompt, N and B: the second chunk evicts
PROBE_MODEL, PROBE_TOKENS, PROBE_BUDGET, PROBE_CHUNK = "random:llama-tiny", 24, 8, 12


def probe_policy(cls: type, ref: str) -> None:
    """Run a plugin policy at its defaults through the engine on a tiny random model for two prompt chunks and one
    decode step (the second chunk evicts), its scores checked to be ``[batch, kv_heads, tokens]`` floats; what
    goes wrong is one line naming the plugin (a budget its protected tokens do not fit is left to the grid)."""
    import torch

    from kdeval.keydiff.config import EngineConfig
    from kdeval.keydiff.engine import Engine

    policy = cls()
    if not policy.evicts:
        return
    try:
        policy.check_budget(PROBE_BUDGET)
    except ValueError:
        return
    score = policy.score

    def checked(keys: torch.Tensor, ctx: Any) -> torch.Tensor:
        out = score(keys, ctx)
        want = tuple(keys.shape[:3])
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.dtype.is_floating_point:
            got = (f"{type(out).__name__} of shape {list(out.shape)} {str(out.dtype).replace('torch.', '')}"
                   if isinstance(out, torch.Tensor) else type(out).__name__)
            raise PluginError(f"plugin {ref}: policy '{cls.name}': score(keys {list(keys.shape)}, ctx) returned "
                              f"{got}; expected floats of shape [batch, kv_heads, tokens] = {list(want)}")
        return out

    policy.score = checked  # this probe's object only
    lm = _probe_model()
    ids = torch.arange(3, 3 + PROBE_TOKENS).unsqueeze(0)
    try:
        Engine(lm.model, policy, EngineConfig(budget=PROBE_BUDGET, chunk_size=PROBE_CHUNK)).generate(
            ids, max_new_tokens=1)
    except PluginError:
        raise
    except Exception as e:  # noqa: BLE001 - the policy's own error, in one line
        raise PluginError(f"plugin {ref}: policy '{cls.name}' failed a one-step probe on {PROBE_MODEL}: "
                          f"{type(e).__name__}: {_one_line(e)}") from None


def _probe_model() -> Any:
    """The probe's tiny model, built once per process."""
    from kdeval.zoo.loading import load_model

    global _PROBE_LM
    if _PROBE_LM is None:
        _PROBE_LM = load_model(PROBE_MODEL, device="cpu")
    return _PROBE_LM


_PROBE_LM: Any = None
