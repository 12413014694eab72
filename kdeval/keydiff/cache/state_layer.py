"""A recurrent layer's cache: its conv and recurrent states, kept whole, beside the budgeted attention layers.

transformers' linear-attention and state-space layers (GatedDeltaNet, KDA, Mamba/Mamba2, LFM2's short
convolution) cache per layer ``number_of_states`` conv states ``[rows, channels, kernel]`` and recurrent states
(e.g. ``[rows, heads, k_dim, v_dim]``), constant in length, and read them through the ``Cache`` methods
``update_conv_state``, ``update_recurrent_state`` and ``has_previous_state``, and the layer's ``conv_states`` /
``recurrent_states`` directly. :class:`StateLayer` is transformers' own ``LinearAttentionLayer`` in a
:class:`~kdeval.keydiff.cache.budget_cache.BudgetCache`, with what the engine's loops ask of every layer: it holds
no tokens (``length`` 0, every row), so no keep rule, bound or policy ever applies to it; its bytes are counted
apart from the K/V bytes (:meth:`state_nbytes`). Rows move with the cache's other layers: selected when a batch's
rows leave (:meth:`keep_rows`), copied into a new cache's rows (:meth:`copy_rows`), so forks and finished batch
rows carry their own state. A state cannot be resumed from a KV prefix: a replayed shared step restores the
recorded states (:meth:`states` / :meth:`load`).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionLayer

#: the state tensors of a layer: ("conv" or "recurrent", state index) -> tensor ``[rows, ...]``
States = dict[tuple[str, int], torch.Tensor]


class RecurrentStates(LinearAttentionLayer):
    """A layer's conv and recurrent states, by row: transformers' ``LinearAttentionLayer`` (whose API the model
    calls) with the row moves the engine makes. :class:`StateLayer` holds only these; a hybrid layer
    (kdeval/keydiff/cache/budget_cache.py ``StateRowLayer``) holds them beside its keys."""

    def state_nbytes(self) -> int:
        """Bytes of the conv and recurrent states, every row."""
        return sum(t.numel() * t.element_size() for t in self.states().values())

    def has_states(self) -> bool:
        return any(self.is_conv_states_initialized.values()) or any(self.is_recurrent_states_initialized.values())

    def states(self) -> States:
        """The layer's state tensors (live, not copies)."""
        out: States = {}
        for i in range(self.number_of_states):
            if self.is_conv_states_initialized[i]:
                out["conv", i] = self.conv_states[i]
            if self.is_recurrent_states_initialized[i]:
                out["recurrent", i] = self.recurrent_states[i]
        return out

    def load(self, states: States) -> None:
        """Take ``states`` (copies) as this layer's, as after the step that made them."""
        for (what, i), t in states.items():
            if what == "conv":
                self.conv_states[i] = t.clone()
                self.is_conv_states_initialized[i] = True
                self.conv_kernel_size[i] = t.shape[-1]
            else:
                self.recurrent_states[i] = t.clone()
                self.is_recurrent_states_initialized[i] = True
            self.has_previous_state[i] = True

    def keep_state_rows(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` of every state (in that order), as the cache's other layers keep theirs."""
        self.load({key: t.index_select(0, index.to(t.device)) for key, t in self.states().items()})

    def copy_state_rows(self, sources: list[tuple["RecurrentStates", int] | None]) -> None:
        """Row ``r`` takes row ``sources[r][1]`` of layer ``sources[r][0]``'s states (``None``: a fresh row, which
        only rows without a state yet may be)."""
        first = next((src[0] for src in sources if src is not None and src[0].has_states()), None)
        if first is None:
            return
        if any(src is None or not src[0].has_states() for src in sources):
            # transformers keeps one "has a previous state" flag per layer, not per row
            raise ValueError("recurrent layers: a fresh row cannot join rows that already hold a state")
        self.load({key: torch.stack([src[0].states()[key][src[1]] for src in sources]) for key in first.states()})


class StateLayer(RecurrentStates):
    """A recurrent layer's cache in the engine's cache (module docstring); ``rows``: the batch's rows when
    known."""

    is_croppable = False

    def __init__(self, number_of_states: int = 1, rows: int = 0):
        super().__init__(number_of_states=number_of_states)
        self.lengths: list[int] = [0] * rows
        self.pending = 0
        self.base = 0
        self.next_positions: torch.Tensor | None = None
        self.limit = None

    # -- what the engine's loops read of every layer: no tokens
    @property
    def length(self) -> int:
        return 0

    @property
    def capacity(self) -> int:
        return 0

    @property
    def is_initialized(self) -> bool:
        return self.has_states()

    def reserve(self, capacity: int) -> None:
        """No slots to reserve: the states are constant in length."""

    def nbytes(self) -> int:
        """K/V bytes: none (the states are counted by :meth:`state_nbytes`)."""
        return 0

    def held_nbytes(self) -> int:
        return 0

    def keep_rows(self, index: torch.Tensor) -> None:
        self.keep_state_rows(index)
        self.lengths = [0] * index.numel()

    def copy_rows(self, sources: list[tuple["StateLayer", int] | None]) -> None:
        self.lengths = [0] * len(sources)
        self.copy_state_rows(sources)
