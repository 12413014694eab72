"""The engine's plan: everything decided once from (model, policy, config) before the first step.

Per-layer budgets, what the policy needs, the cache layout, the attention function each kind of step runs
under and whether CUDA graphs run (and, when they do not, why). Every other part of the engine reads the plan;
nothing re-derives it. Also here: the checks a prompt and a state to continue pass before a step runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.attention.capture import CAPTURE_IMPL, POOL_IMPL, RAGGED_IMPL, SDPA_IMPL, STATIC_IMPL, has_sinks
from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.attention.layer_kinds import LayerKind, decoder_config, describe, layer_kinds
from kdeval.keydiff.plan.refusals import (latent_refusal, partial_rotary_refusal, recurrent_refusal,
                                          windowed_refusal)
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds
from kdeval.keydiff.quant.rule import KVQuant
from kdeval.keydiff.attention.queries import query_sources, rotary_embedding
from kdeval.keydiff.attention.reads import layer_projections

if TYPE_CHECKING:
    from kdeval.keydiff.cache.ragged import RaggedStep
    from kdeval.keydiff.loop.state import PrefillState

#: the model attention implementations the engine's own attention functions (all SDPA-based) may replace
SDPA_FAMILY = ("sdpa", SDPA_IMPL, CAPTURE_IMPL, STATIC_IMPL, RAGGED_IMPL, POOL_IMPL)


def own_attention_reason(needs: PolicyNeeds, per_layer_budgets: bool, windowed: bool = False, sinks: bool = False
                         ) -> str | None:
    """Why a policy with ``needs`` runs under one of the engine's SDPA-based attention functions whatever
    the model's own implementation, or ``None`` when the model's attention serves (score-only policies)."""
    if windowed:
        return "runs a model with windowed layers, whose masks by position only the engine's attention takes"
    if sinks:
        return "runs a model with attention sinks, which the engine's attention computes"
    if needs.attention is not None:
        return f"reads attention rows ({needs.attention.rows_label()}), computed beside SDPA"
    if per_layer_budgets:
        return "keeps a budget per layer, so attention takes each layer's own mask (SDPA)"
    if needs.shares_heads:
        return "shares a layer's slots among its KV heads, whose mask only SDPA takes"
    if needs.repeat is not None:
        return "scores a repeat pass by its attention, computed beside SDPA"
    return None


@dataclass(frozen=True)
class Plan:
    """What the engine does for one (model, policy, config), decided once (module docstring)."""

    config: EngineConfig
    policy_name: str
    #: what the policy's scores read (``PolicyNeeds()`` without eviction)
    needs: PolicyNeeds
    #: the policy evicts and a budget is set
    evicting: bool
    #: tokens each layer keeps (the policy's allocation of N; ``None`` without eviction)
    budgets: tuple[int, ...] | None
    #: every layer keeps the same budget: transformers' one mask serves every layer
    uniform: bool
    num_layers: int
    #: query heads per KV head
    group: int
    #: the model's context (``max_position_embeddings``; 0: unknown)
    max_context: int
    device: torch.device
    #: the model's own attention implementation
    model_attention: str
    #: the attention implementation of an eager (not static-layout) step; ``None``: the model's own
    step_attention: str | None
    #: the static layout and its captured step run (CUDA graphs, or a test's graph runner)
    use_graphs: bool
    #: why graphs do not run although asked for (or on by default), ``None`` when they run or were not asked for
    graphs_off: str | None
    #: how kept tokens are stored (kdeval/keydiff/quant/rule.py, kdeval/keydiff/quant/store.py); ``None``: full width
    kv_quant: KVQuant | None = None
    #: each layer's kind (kdeval/keydiff/attention/layer_kinds.py): windowed layers keep what the model sees, the policy
    #: evicts the full-attention ones (empty: every layer full)
    kinds: tuple[LayerKind, ...] = ()
    #: the model's attention has learned sink logits (GPT-OSS): the engine's attention computes them, also for a
    #: model loaded with eager attention (transformers runs such a model in no SDPA)
    sinks: bool = False
    #: multi-head latent attention (DeepSeek-V2/V3): each layer caches one "head" per token, its compressed latent
    #: (as the keys) and its shared rotary key (as the values), expanded per head after the cache read; evicting a
    #: token drops both, and a policy scores the latents (its captured rows fold every query head onto that one)
    latent: bool = False
    #: conv/recurrent states per recurrent layer (transformers' ``number_of_conv_states``)
    states_per_layer: int = 1

    @property
    def windowed(self) -> bool:
        """Some layer is windowed (sliding or chunked attention): a hybrid model."""
        return any(k.windowed for k in self.kinds)

    @property
    def recurrent(self) -> bool:
        """Some layer caches a recurrent or conv state (linear attention, Mamba, short conv): a state hybrid."""
        return any(k.holds_state for k in self.kinds)

    @property
    def kv_layers(self) -> list[int]:
        """The indices of the layers that cache keys and values (all of them but the ``state`` layers)."""
        return [i for i in range(self.num_layers) if self.kind(i).attends]

    def layer_kinds_label(self) -> str:
        """The layers by kind in words (``"18 layers: 3 full, 15 sliding 512"``); empty for a model of full layers
        only."""
        return describe(self.kinds) if any(k != LayerKind() for k in self.kinds) else ""

    def kind(self, idx: int) -> LayerKind:
        return self.kinds[idx] if self.kinds else LayerKind()

    @property
    def windowed_layers(self) -> list[int]:
        """The indices of the windowed layers with keys of their own (empty on a model of full layers only)."""
        return [i for i, k in enumerate(self.kinds) if k.windowed and k.attends]

    def trims(self, idx: int) -> bool:
        """Layer ``idx`` is windowed: cut to what the model sees after every step, whatever the policy."""
        return self.kind(idx).windowed and self.kind(idx).attends

    def layer_limit(self, idx: int) -> int | None:
        """The most tokens layer ``idx`` holds between evicting steps (``None``: it grows)."""
        kind = self.kind(idx)
        if not kind.attends:
            return 0
        if kind.windowed:
            return kind.most_kept()
        return self.budgets[idx] if self.evicting else None

    def keep(self, idx: int, n: int, t: int, seen_after: int, evict: bool, held: int) -> int:
        """The one keep rule: the tokens layer ``idx`` holds after a step of ``t`` tokens after ``n`` held, with
        ``seen_after`` tokens then processed; ``evict``: the step evicts; ``held``: protected tokens on top of
        the budget. A windowed layer keeps what the next query sees, whatever the step; a full layer its budget
        plus ``held`` when the policy evicts, else everything."""
        kind = self.kind(idx)
        if not kind.attends:  # a recurrent layer's states, a layer reading another's keys: no tokens
            return 0
        if kind.windowed:
            return min(n + t, kind.kept_count(seen_after))
        if self.evicting and evict:
            return min(self.budgets[idx] + held, n + t)
        return n + t

    def layer_steps(self, lengths: list[list[int]], t: list[int], seen: list[int], evicts: list[bool],
                    held: list[int]) -> list["RaggedStep"]:
        """Each layer's step geometry (:class:`~kdeval.keydiff.cache.ragged.RaggedStep`) for a step of ``t[r]`` tokens per
        row after ``seen[r]``: ``lengths[l][r]`` held in layer ``l``, ``evicts[r]`` whether row ``r``'s step evicts,
        ``held[r]`` its protected tokens; what a row keeps is :meth:`keep`. Layers whose rows hold and keep the
        same counts share one."""
        from kdeval.keydiff.cache.ragged import RaggedStep  # here: the plan is also read where transformers is not loaded

        by_counts: dict = {}
        out = []
        for idx, n in enumerate(lengths):
            if self.kind(idx).reads_layer is not None:  # it attends over its source's slots, as its source does
                out.append(out[self.kind(idx).reads_layer])
                continue
            keep = [self.keep(idx, a, b, s + b, e, h) for a, b, s, e, h in zip(n, t, seen, evicts, held)]
            key = (tuple(n), tuple(keep))
            if key not in by_counts:
                by_counts[key] = RaggedStep(list(n), t, keep, seen, self.device, self.rerotate)
            out.append(by_counts[key])
        return out

    @property
    def rerotate(self) -> bool:
        return self.needs.rerotates

    @property
    def shares_heads(self) -> bool:
        return self.needs.shares_heads


def checked_layer_budgets(policy: Policy, n: int, num_layers: int) -> list[int]:
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


def eager_reasons(needs: PolicyNeeds, per_layer_budgets: bool = False) -> list[str]:
    """Why a policy with ``needs`` runs without CUDA graphs (one captured step serves every chunk of a fixed
    static layout), in words; empty when graphs can run it. The one list of these reasons: the plan's
    :attr:`Plan.graphs_off` and ``kdeval policies``' cost column both read it."""
    return [why for why, yes in (
        ("scores read the step count", needs.reads_step),  # a graph would freeze it
        ("a query window between steps", needs.queries is not None),
        ("re-rotation", needs.rerotates),
        ("per-layer budgets", per_layer_budgets),  # the static layout gives every layer N slots
        ("a head-shared pool", needs.shares_heads),
        ("kept keys edited after eviction", needs.edits_kept_keys),
        ("a repeat pass after each evicting prompt step", needs.repeat is not None),  # host-side pieces
    ) if yes]


def _graphs_off(needs: PolicyNeeds, evicting: bool, uniform: bool, model_attention: str, quantized: bool = False,
                windowed: bool = False, sinks: bool = False, latent: bool = False, recurrent: bool = False
                ) -> str | None:
    """Why the graph path cannot run this policy, or ``None``."""
    per_layer = not uniform and not windowed and not sinks
    reasons = (["nothing is evicted"] if not evicting else []) + eager_reasons(needs, per_layer)
    if windowed:  # the static layout gives every layer N slots
        reasons.append("windowed layers")
    if sinks:
        reasons.append("attention sinks")
    if latent:
        reasons.append("latent (MLA) rows")
    if recurrent:  # the states are updated by the model's own kernels, outside the static layout
        reasons.append("recurrent layers")
    if quantized:  # the tokens to quantize each step are found on the host
        reasons.append("a quantized KV store")
    if model_attention not in SDPA_FAMILY:
        reasons.append(f"the static layout's attention runs on SDPA; the model uses {model_attention!r}")
    return "; ".join(reasons) or None


def make_plan(model: torch.nn.Module, policy: Policy, config: EngineConfig, graph_runner_given: bool = False
              ) -> Plan:
    """The plan for ``policy`` on ``model`` under ``config``; ``ValueError`` naming the setting for what cannot run
    (graphs asked for without CUDA and without a graph runner of the caller's, a budget the policy cannot split, an
    attention implementation the policy cannot run beside)."""
    cfg = decoder_config(model.config)
    num_layers = cfg.num_hidden_layers
    evicting = policy.evicts and config.budget is not None
    kinds = layer_kinds(cfg)
    windowed = any(k.windowed for k in kinds)
    recurrent = any(k.holds_state for k in kinds)
    sinks = has_sinks(model)
    latent = caches_latents(model)
    budgets = _layer_budgets(policy, config.budget, kinds) if evicting else None
    # windowed layers and sinks take the engine's own attention, whose masks go by position; a recurrent layer's
    # budget (no tokens) is no attention layer's
    attending = [b for b, k in zip(budgets or (), kinds) if k.attends]
    uniform = not windowed and not sinks and len(set(attending)) <= 1
    needs = policy.needs() if evicting else PolicyNeeds()
    for why in (windowed_refusal(needs) if windowed else None, latent_refusal(needs) if latent else None,
                recurrent_refusal(needs) if recurrent else None, partial_rotary_refusal(needs, cfg)):
        if why is not None:
            raise ValueError(f"policy: '{policy.name}' {why}")
    if latent and config.kv_quant is not None:
        raise ValueError("kv_quant: a multi-head latent attention (MLA) cache is not quantized by the engine")
    if needs.merges and needs.shares_heads:
        raise ValueError(f"policy: '{policy.name}' merges freed tokens into kept ones, which a head-shared pool "
                         f"does not do")
    if needs.queries is not None:
        query_sources(model)  # the model must have what the policy reads: refused here, not mid-run
    if needs.projections:
        layer_projections(model)
    if needs.queries is not None or needs.rerotates:
        rotary_embedding(model)
    if needs.edits_kept_keys and needs.shares_heads:
        raise ValueError(f"policy: '{policy.name}' edits its kept keys per KV head, which a head-shared pool does "
                         f"not lay out")
    device = next(model.parameters()).device
    if config.cuda_graphs and device.type != "cuda" and not graph_runner_given:
        raise ValueError(f"cuda_graphs: needs a CUDA device (the model is on {device.type})")
    model_attention = cfg._attn_implementation
    why = own_attention_reason(needs, not uniform, windowed, sinks)
    if why is not None and model_attention not in SDPA_FAMILY and not (sinks and model_attention == "eager"):
        raise ValueError(f"attn_implementation: policy '{policy.name}' {why}; the model uses {model_attention!r} "
                         f"(load it with attn_implementation='sdpa')")
    if why is not None:
        _check_reach(model, policy.name, why)
    step_attention = (POOL_IMPL if needs.shares_heads else STATIC_IMPL if not uniform
                      else CAPTURE_IMPL if needs.attention is not None
                      else SDPA_IMPL if model_attention in SDPA_FAMILY else None)
    wanted = config.cuda_graphs if config.cuda_graphs is not None else device.type == "cuda"
    quant = config.kv_quant
    off = _graphs_off(needs, evicting, uniform, model_attention, quant is not None, windowed, sinks, latent,
                      recurrent) if wanted else None
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if latent:  # one latent row a token: every query head reads it
        heads = 1
    if quant is not None:
        quant.check_head_dim(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return Plan(config=config, policy_name=policy.name, needs=needs, evicting=evicting, budgets=budgets,
                uniform=uniform, num_layers=num_layers, group=cfg.num_attention_heads // heads,
                max_context=int(getattr(cfg, "max_position_embeddings", 0) or 0), device=device,
                model_attention=model_attention, step_attention=step_attention, use_graphs=wanted and off is None,
                graphs_off=off, kv_quant=quant, kinds=kinds, sinks=sinks,
                latent=latent, states_per_layer=int(getattr(cfg, "number_of_conv_states", 1) or 1))


def _layer_budgets(policy: Policy, n: int, kinds: tuple[LayerKind, ...]) -> tuple[int, ...]:
    """Each layer's keep count under budget ``n``: the policy's allocation of ``n`` over the full-attention
    layers (``n`` is tokens per full-attention layer and KV head), each windowed layer's window, a recurrent layer
    0 (it holds no tokens)."""
    full = [i for i, k in enumerate(kinds) if k.evicted]
    shares = iter(checked_layer_budgets(policy, n, len(full)) if full else [])
    return tuple(0 if not k.attends else k.most_kept() if k.windowed else next(shares) for k in kinds)


def _check_reach(model: torch.nn.Module, policy_name: str, why: str) -> None:
    """Refuse (``ValueError`` naming ``policy``) a run whose policy hands the engine's attention functions keywords
    (``why``) on a model whose layers drop them on the way, or never call those functions
    (kdeval/keydiff/attention/reach.py)."""
    from kdeval.keydiff.attention.reach import attention_reach  # here: the plan is also read where transformers is not loaded

    reach = attention_reach(model)
    name = type(model).__name__
    if not reach.attention_runs_ours:
        raise ValueError(f"policy: '{policy_name}' {why}; {name} computes attention in its own code, not through "
                         f"transformers' attention interface")
    if not reach.layers_named:
        raise ValueError(f"policy: '{policy_name}' {why}; {name}'s attention modules do not carry their decoder "
                         f"layer's index (a block shared across layers), so what the engine captures is no layer's")
    if not reach.keywords_arrive:
        raise ValueError(f"policy: '{policy_name}' {why}; {name}'s layers drop the forward's keyword arguments "
                         f"before attention, so the engine's attention never gets them")


def caches_latents(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention caches compressed latents and expands them per head after the cache read
    (multi-head latent attention: transformers' ``expand_kv``)."""
    return any(callable(getattr(m, "expand_kv", None)) for m in model.modules())


def expanded_latent_groups(model: torch.nn.Module) -> None:
    """Make every MLA attention module's ``num_key_value_groups`` 1: its ``expand_kv`` already gives each query
    head its own key and value, so attention must not repeat them again. transformers sets it from
    ``num_attention_heads // num_key_value_heads`` (2 for 4 heads over 2) and its SDPA repeats the expanded keys
    whenever a mask is passed, as every chunk after the first has: 8 key heads for 4 query heads."""
    for m in model.modules():
        if callable(getattr(m, "expand_kv", None)) and getattr(m, "num_key_value_groups", 1) != 1:
            m.num_key_value_groups = 1


def check_ids(plan: Plan, input_ids: torch.Tensor, state: "PrefillState | None", max_new: int = 0) -> torch.Tensor:
    """``input_ids`` as ``[batch, tokens]`` on the model's device, checked: non-empty, within the model's context
    with ``state``'s tokens and ``max_new`` generated ones, and ``state`` one this plan can continue."""
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids: expected a non-empty [batch, tokens] tensor, got shape {tuple(input_ids.shape)}")
    if state is not None:
        check_continuable(plan, state)
    total = (state.seen if state else 0) + input_ids.shape[1] + max_new
    if plan.max_context and total > plan.max_context:
        raise ValueError(
            f"prompt: {total} tokens (prompt + cached + max_new_tokens) exceed the model's context of "
            f"{plan.max_context} tokens (max_position_embeddings)"
        )
    return input_ids.to(plan.device)


def check_continuable(plan: Plan, state: "PrefillState") -> None:
    """Refuse (``ValueError`` naming ``state``) a state this plan cannot continue: released, laid out for other
    graph settings, rotated at the other positions, of the other cache kind, or without the per-token
    state the policy keeps."""
    from kdeval.keydiff.cache.headpool import HeadPoolCache  # here: the plan is also read where transformers is not loaded

    state.check_usable()
    name = plan.policy_name
    layout = plan.config.budget if plan.use_graphs else None
    if state.cache.static_base != layout and not (
            state.cache.static_base is None and state.cache.thawed_from == layout):
        raise ValueError("state: its cache was laid out by an engine with other graph settings; "
                         "continue it with the engine that made it")
    if state.cache.rerotated != plan.rerotate and state.cache.length < state.seen:
        raise ValueError("state: its kept keys are rotated at " + ("contiguous" if state.cache.rerotated else
                         "their absolute") + f" positions, policy '{name}' expects "
                         + ("contiguous" if plan.rerotate else "absolute") + " ones; continue it with the policy "
                         "that made it")
    if isinstance(state.cache, HeadPoolCache) != plan.shares_heads:
        theirs, ours = ("does not share", "does") if plan.shares_heads else ("shares", "does not")
        raise ValueError(f"state: its cache {theirs} its slots among KV heads, policy '{name}' "
                         f"{ours}; continue it with the policy that made it")
    wanted = plan.needs.token_state
    if set(wanted) - set(state.cache.state_names):
        raise ValueError(f"state: its cache keeps the per-token state {list(state.cache.state_names)}, policy "
                         f"'{name}' needs {list(wanted)}; continue it with the policy that made it")
