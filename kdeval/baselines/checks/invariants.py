"""The invariants every eviction policy must keep, each a function of a :class:`Setup` that returns None when it
holds and else its first counterexample in one line (family, layer, step, positions).

Sizes are small so the whole matrix runs in seconds on a CPU: a prompt of :data:`PROMPT` random tokens, N =
:data:`BUDGET` (at least every built-in policy's protected tokens at its defaults), B = :data:`CHUNK`. Equalities
(a batch row and the prompt alone, shared steps and alone, chunked and one pass) are checked in float64, where a
batch's other summation order moves logits by less than 1e-10 and cannot swap two near-tied scores of a random
model; the bound holds exactly in every dtype and is checked in float32 and bfloat16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.engine import Engine
from kdeval.keydiff.policy.interface import Policy
from kdeval.keydiff.step.shared import SharedSteps
from kdeval.zoo.loading import LoadedModel

PROMPT, BUDGET, CHUNK, NEW = 90, 40, 16, 4
#: the prompts of the shared-steps check: long enough to share steps before the first eviction and after
LONG = 120


@dataclass(frozen=True)
class Setup:
    """One family's tiny model in one dtype, and how to build the policy under test afresh."""

    family: str
    lm: LoadedModel
    make_policy: Callable[[], Policy]

    def engine(self, budget: int | None = BUDGET, chunk: int | str = CHUNK, on_step=None) -> Engine:
        return Engine(self.lm.model, self.make_policy(), EngineConfig(budget=budget, chunk_size=chunk), on_step)

    def where(self, layer: int | None = None, step: int | None = None, row: int | None = None) -> str:
        parts = [self.family, f"layer {layer}" if layer is not None else "", f"step {step}" if step is not None
                 else "", f"row {row}" if row is not None else ""]
        return ", ".join(p for p in parts if p)


def prompt(n: int = PROMPT, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """``[batch, n]`` random token ids below 256 (every tiny model's vocabulary holds them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, n), generator=g)


def kept(state) -> list[torch.Tensor]:
    """Per layer, the sorted absolute positions held: ``[batch, kv_heads, tokens]``."""
    return [layer.view()[1].sort(dim=-1).values for layer in state.cache.layers]


def _differ(a: torch.Tensor, b: torch.Tensor) -> str:
    """The positions one of two ``[kv_heads, tokens]`` kept sets holds and the other not, in words."""
    for head in range(min(a.shape[0], b.shape[0])):
        x, y = set(a[head].tolist()), set(b[head].tolist())
        if x != y:
            return f"head {head}: positions {sorted(x - y)[:4]} against {sorted(y - x)[:4]}"
    return f"shapes {tuple(a.shape)} against {tuple(b.shape)}"


def _first_difference(setup: Setup, got, ref, row: int = 0, ref_row: int = 0, what: str = "alone") -> str | None:
    """Where two runs first part: generated tokens, then kept positions (layer by layer)."""
    for layer, (a, b) in enumerate(zip(kept(got.state), kept(ref.state))):
        if a.shape[1:] != b.shape[1:] or not torch.equal(a[row], b[ref_row]):
            return f"{setup.where(layer, row=row)}: kept {_differ(a[row], b[ref_row])} {what}"
    if got.tokens[row] != ref.tokens[ref_row]:
        return f"{setup.where(row=row)}: generated {got.tokens[row]}, {what} {ref.tokens[ref_row]}"
    return None


def bound(setup: Setup) -> str | None:
    """After every chunk and decode step the full layers hold together at most layers x min(N, seen) tokens per
    KV head, and each exactly min(its budget, seen) (N, or its share under per-layer budgets, which sum to layers x
    N; a head-shared pool the layer's total), each position at most once and none not yet seen; a windowed layer at
    most its window; the peak at most the fullest layer's limit + B."""
    first: list[str] = []
    step = [0]
    eng_box: list[Engine] = []

    def check(state) -> None:
        step[0] += 1
        if first:
            return
        plan = eng_box[0].plan
        full = [i for i in range(plan.num_layers) if not plan.trims(i)]
        held = [state.cache.layers[i].view()[0].shape[2] for i in full]
        most = len(full) * min(BUDGET, state.seen) * (plan_heads(setup) if plan.shares_heads else 1)
        if sum(held) > most:  # the layers together hold more than layers x N (their budgets' sum is too large)
            over = max(range(len(full)), key=lambda j: held[j])
            positions = state.cache.layers[full[over]].view()[1][0, 0].sort().values.tolist()
            first.append(f"{setup.where(full[over], step[0])} (seen {state.seen}): the full layers hold {held} tokens "
                         f"per KV head, {sum(held)} in all, more than {len(full)} layers x min(N={BUDGET}, seen) = "
                         f"{most}; layer {full[over]} keeps positions {positions[:3]} ... {positions[-3:]}")
            return
        for idx, layer in enumerate(state.cache.layers):
            keys, positions, _ = layer.view()
            flat = positions.reshape(-1, positions.shape[-1])
            if positions.numel() and int(positions.max()) >= state.seen:
                first.append(f"{setup.where(idx, step[0])}: holds position {int(positions.max())}, "
                             f"not seen yet (seen {state.seen})")
                return
            dup = next((r for r in flat if len(set(r.tolist())) != r.numel()), None)
            if dup is not None and not plan.shares_heads:
                first.append(f"{setup.where(idx, step[0])}: holds a position twice ({sorted(dup.tolist())[:8]}...)")
                return
            if plan.trims(idx):
                limit = plan.layer_limit(idx)
                if keys.shape[2] > limit:
                    first.append(f"{setup.where(idx, step[0])}: a windowed layer holds {keys.shape[2]} > {limit}")
                    return
                continue
            budget = plan.budgets[idx]
            heads = positions.shape[1]
            want = min(budget, state.seen) * (plan_heads(setup) if plan.shares_heads else 1)
            if keys.shape[2] != want:
                first.append(f"{setup.where(idx, step[0])}: holds {keys.shape[2]} tokens per "
                             f"{'layer pool' if plan.shares_heads else f'KV head (of {heads})'}, expected "
                             f"min(N={budget}, seen={state.seen}) = {want}")
                return

    eng = setup.engine(on_step=check)
    eng_box.append(eng)
    full_layers = [i for i in range(eng.plan.num_layers) if not eng.plan.trims(i)]
    per = [eng.plan.budgets[i] for i in full_layers]
    res = eng.generate(prompt(), max_new_tokens=NEW)
    if first:
        return first[0]
    if sum(per) != BUDGET * len(full_layers):  # per-layer budgets share layers x N: fewer is a bound kept loosely
        return (f"{setup.family}: layer budgets {per} sum to {sum(per)}, not {len(full_layers)} layers x N={BUDGET} = "
                f"{BUDGET * len(full_layers)}")
    limits = [eng.plan.layer_limit(i) for i in range(eng.plan.num_layers)]
    most = max(x for x in limits if x is not None)
    if res.stats.peak_kv_tokens > most + CHUNK:
        return (f"{setup.family}: peak {res.stats.peak_kv_tokens} tokens in a layer, above N + B = "
                f"{most} + {CHUNK}")
    return None


def plan_heads(setup: Setup) -> int:
    """KV heads per layer of the setup's model (what a head-shared pool holds ``heads x N`` of)."""
    cfg = setup.lm.model.config
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def batch_alone(setup: Setup) -> str | None:
    """A batch of two prompts keeps in each row what that prompt keeps alone, and generates the same tokens;
    a ragged batch (``generate_batch``, prompts of 37, 70 and 5 tokens) likewise."""
    ids = prompt(batch=2, seed=7)
    both = setup.engine().generate(ids, max_new_tokens=NEW)
    for r in range(2):
        alone = setup.engine().generate(ids[r : r + 1], max_new_tokens=NEW)
        why = _first_difference(setup, both, alone, row=r, what="in the batch, alone")
        if why:
            return f"batch of 2: {why}"
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in (37, 70, 5)]
    eng = setup.engine()
    for r, (x, got) in enumerate(zip(prompts, eng.generate_batch(prompts, max_new_tokens=NEW))):
        why = _first_difference(setup, got, eng.generate(x.unsqueeze(0), max_new_tokens=NEW),
                                what="in the ragged batch, alone")
        if why:
            return f"ragged batch, prompt {r} ({len(x)} tokens): {why}"
    return None


def chunked_one_pass(setup: Setup) -> str | None:
    """With a budget that holds the whole prompt and answer (nothing evicted), chunked prefill generates what one
    pass does, with last logits within 1e-8 (1e-4 in float32)."""
    room = PROMPT + NEW + 8
    chunked = setup.engine(budget=room).generate(prompt(), max_new_tokens=NEW)
    whole = setup.engine(budget=room, chunk=PROMPT).generate(prompt(), max_new_tokens=NEW)
    if chunked.tokens != whole.tokens:
        return f"{setup.family}: chunks of {CHUNK} generate {chunked.tokens[0]}, one pass {whole.tokens[0]}"
    gap = (chunked.state.last_logits - whole.state.last_logits).abs().max().item()
    if gap > (1e-8 if chunked.state.last_logits.dtype == torch.float64 else 1e-4):
        return f"{setup.family}: last logits of chunks of {CHUNK} and one pass differ by {gap:.2e}"
    return None


def shared_alone(setup: Setup) -> str | None:
    """Through a store of shared steps another cell (``full``) recorded, the policy generates what it does alone,
    under both protocols (the question evicted, and its last 20 tokens protected); forked from the store and then
    batched with another prompt, each row is the same as that batch run alone."""
    from kdeval.keydiff.policy.full import Full

    for protect in (0, 20):
        store = SharedSteps([setup.make_policy()], max_tokens=2 * BUDGET + CHUNK)
        full = Engine(setup.lm.model, Full(), EngineConfig(budget=None, chunk_size=CHUNK))
        with full.sharing(store):
            full.generate(prompt(LONG, seed=3), max_new_tokens=NEW, protect_last=protect)
        eng = setup.engine()
        with eng.sharing(store):
            got = eng.generate(prompt(LONG, seed=3), max_new_tokens=NEW, protect_last=protect)
        ref = setup.engine().generate(prompt(LONG, seed=3), max_new_tokens=NEW, protect_last=protect)
        why = _first_difference(setup, got, ref, what="through shared steps, alone")
        if why:
            return f"shared steps (protect_last={protect}): {why}"
    ids = [prompt(LONG, seed=3)[0], prompt(LONG - 11, seed=4)[0]]
    protect = [20, 0]
    stores = [SharedSteps([setup.make_policy()], max_tokens=2 * BUDGET + CHUNK) for _ in ids]
    full = Engine(setup.lm.model, Full(), EngineConfig(budget=None, chunk_size=CHUNK))
    for x, store, p in zip(ids, stores, protect):
        with full.sharing(store):
            full.prefill_shared(x.unsqueeze(0), p)
    eng = setup.engine()
    states = []
    for x, store, p in zip(ids, stores, protect):
        with eng.sharing(store):
            states.append(eng.prefill_shared(x.unsqueeze(0), p))
    rests = [x[s.seen:] for x, s in zip(ids, states)]
    got = eng.generate_batch(rests, max_new_tokens=NEW, states=states, protect_last=protect)
    ref = eng.generate_batch(ids, max_new_tokens=NEW, protect_last=protect)
    for r, (g, f) in enumerate(zip(got, ref)):
        why = _first_difference(setup, g, f, what="forked then batched, the batch alone")
        if why:
            return f"fork (prompt {r}, forked at {states[r].seen}): {why}"
    return None


def deterministic(setup: Setup) -> str | None:
    """Two runs keep the same tokens; and where scores tie exactly at the keep boundary the policy declares
    ``PolicyNeeds(exact_ties=True)``, so ties go oldest first and the kept set does not depend on which slot holds
    a token."""
    a = setup.engine().generate(prompt(seed=5), max_new_tokens=NEW)
    b = setup.engine().generate(prompt(seed=5), max_new_tokens=NEW)
    why = _first_difference(setup, a, b, what="in one run, in the next")
    if why:
        return f"two runs differ: {why}"
    policy = setup.make_policy()
    if policy.needs().exact_ties:
        return None
    ties: list[str] = []
    score = policy.score

    def watched(keys, ctx):
        s = score(keys, ctx)
        if not ties and ctx.budget and s.shape[-1] > ctx.budget and s.dtype.is_floating_point:
            # the tokens the policy always keeps (sinks, recent) are kept whatever they score: not a tie
            seen = int(ctx.seen)
            held = (ctx.positions < policy.n_sink()) | (ctx.positions >= seen - policy.n_recent(ctx.budget))
            top = s.float().masked_fill(held, float("inf")).sort(dim=-1, descending=True)
            edge = top.values[..., ctx.budget - 1] == top.values[..., ctx.budget]
            if bool(edge.any()):
                b_, h = (int(i) for i in edge.nonzero()[0])
                pos = ctx.positions[b_, h].gather(-1, top.indices[b_, h, ctx.budget - 1 : ctx.budget + 1])
                ties.append(f"{setup.where(ctx.layer_idx, int(ctx.step) + 1)}: positions {pos.tolist()} tie at score "
                            f"{float(top.values[b_, h, ctx.budget]):g} at the keep boundary (N={ctx.budget}); "
                            "declare PolicyNeeds(exact_ties=True)")
        return s

    policy.score = watched  # this object only
    Engine(setup.lm.model, policy, EngineConfig(budget=BUDGET, chunk_size=CHUNK)).generate(prompt(seed=5),
                                                                                          max_new_tokens=NEW)
    return ties[0] if ties else None


def bf16_batch(setup: Setup) -> str | None:
    """In bfloat16 a batch row keeps at least 90% of what the prompt keeps alone (the batch's products round
    otherwise and may swap near-tied scores; the suite measured 100% for all but one built-in policy)."""
    ids = prompt(batch=2, seed=7)
    both = setup.engine().generate(ids, max_new_tokens=3)
    for r in range(2):
        alone = setup.engine().generate(ids[r : r + 1], max_new_tokens=3)
        for layer, (pa, pb) in enumerate(zip(kept(alone.state), kept(both.state))):
            a, b = set(pa[0].flatten().tolist()), set(pb[r].flatten().tolist())
            if len(a & b) < 0.9 * len(a):
                return f"{setup.where(layer, row=r)}: the batch row shares {len(a & b)} of {len(a)} kept positions"
    return None
