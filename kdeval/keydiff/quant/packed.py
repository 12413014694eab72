"""The record of a quantized KV store (kdeval/keydiff/quant/store.py): per layer, the quantized tokens as packed codes.

:func:`pack` puts ``b``-bit codes (``uint8``, each below ``2^b``) into bytes, ``8 / b`` codes a byte (the first
code in the low bits), a token's row padded with zero codes to whole bytes; :func:`unpack` inverts it.

:class:`LayerRecord` is what one layer of a cache stores of its quantized tokens, keyed by (batch row, KV head,
absolute position), so slot moves (compaction, a head-shared pool's reordering) never touch it:

- per token (``tokens [n]``, sorted): the packed key and value codes, the value groups' scales and zeros and,
  under ``per_token``, the key groups' too, at the cache's dtype;
- under ``kivi``, per live key group (``groups [g]``, sorted: (row, KV head, ``position // G``)): one scale and one
  zero per channel. A group's scales are dropped once none of its tokens is held.

The full-precision tokens are the held slots that are not in the record. :meth:`LayerRecord.nbytes` counts the
codes, scales and zeros; the int64 keys that index them are bookkeeping (a store laid out in slot order would
not need them) and are not counted. A key is ``(row * heads + head) << 32 | position``.
"""
from __future__ import annotations

import torch

from kdeval.keydiff.quant.rule import KVQuant, dequantize, per_token_dequantize

SHIFT = 32
LOW = (1 << SHIFT) - 1


def packed_width(n: int, bits: int) -> int:
    """Bytes of ``n`` codes of ``bits`` bits packed (whole bytes)."""
    return -(-n * bits // 8)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``codes [..., n]`` (uint8 below ``2^bits``) → ``[..., packed_width(n, bits)]`` uint8."""
    per = 8 // bits
    pad = -codes.shape[-1] % per
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad))
    c = codes.to(torch.uint8).unflatten(-1, (-1, per))
    out = c[..., 0].clone()
    for i in range(1, per):
        out |= c[..., i] << (bits * i)
    return out


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """:func:`pack`'s inverse: ``[..., n]`` uint8 codes."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.flatten(-2)[..., :n]


def token_keys(rowhead: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Keys of tokens at ``positions`` of (row, KV head) ``rowhead = row * heads + head``."""
    return (rowhead.long() << SHIFT) | positions.long()


class LayerRecord:
    """One layer's quantized tokens (module docstring): ``heads`` KV heads, key width ``d``, value width ``dv``,
    scales and zeros in ``dtype``."""

    def __init__(self, quant: KVQuant, heads: int, d: int, dv: int, dtype: torch.dtype, device: torch.device):
        self.quant, self.heads, self.d, self.dv, self.dtype = quant, heads, d, dv, dtype
        q, g = quant, quant.group_size

        def empty(*shape, dt=dtype):
            return torch.empty(shape, dtype=dt, device=device)

        self.tokens = empty(0, dt=torch.long)
        self.per_token = {"k_codes": empty(0, packed_width(d, q.bits), dt=torch.uint8),
                          "v_codes": empty(0, packed_width(dv, q.bits), dt=torch.uint8),
                          "v_scale": empty(0, dv // g), "v_zero": empty(0, dv // g)}
        self.groups = empty(0, dt=torch.long)
        self.per_group: dict[str, torch.Tensor] = {}
        if q.scheme == "kivi":
            self.per_group = {"k_scale": empty(0, d), "k_zero": empty(0, d)}
        else:
            self.per_token.update(k_scale=empty(0, d // g), k_zero=empty(0, d // g))

    # ---------------------------------------------------------------- reading

    @property
    def count(self) -> int:
        return self.tokens.numel()

    def nbytes(self) -> int:
        """Bytes of the codes, scales and zeros (not of the int64 keys that index them)."""
        return sum(t.nbytes for t in (*self.per_token.values(), *self.per_group.values()))

    @property
    def full_token_bytes(self) -> int:
        """Bytes of one full-precision token per KV head (key and value at the cache's width)."""
        return (self.d + self.dv) * torch.finfo(self.dtype).bits // 8

    def group_keys(self, tokens: torch.Tensor) -> torch.Tensor:
        """The ``kivi`` key group of each token key."""
        return ((tokens >> SHIFT) << SHIFT) | ((tokens & LOW) // self.quant.group_size)

    def index(self, tokens: torch.Tensor) -> torch.Tensor:
        """Where ``tokens`` sit in the record (``KeyError`` if one is not there)."""
        at = torch.searchsorted(self.tokens, tokens).clamp_(max=max(self.count - 1, 0))
        if tokens.numel() and (not self.count or not torch.equal(self.tokens[at], tokens)):
            raise KeyError("a token not in the record")
        return at

    def contains(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.isin(tokens, self.tokens)

    def dequantized(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``[k, d]`` and values ``[k, dv]`` that the record's codes of ``tokens`` dequantize to."""
        at, t, bits = self.index(tokens), self.per_token, self.quant.bits
        values = per_token_dequantize(unpack(t["v_codes"][at], bits, self.dv), t["v_scale"][at], t["v_zero"][at])
        k_codes = unpack(t["k_codes"][at], bits, self.d)
        if self.per_group:
            g = torch.searchsorted(self.groups, self.group_keys(tokens))
            keys = dequantize(k_codes, self.per_group["k_scale"][g], self.per_group["k_zero"][g])
        else:
            keys = per_token_dequantize(k_codes, t["k_scale"][at], t["k_zero"][at])
        return keys, values

    # ---------------------------------------------------------------- writing

    def _take_tokens(self, at: torch.Tensor) -> None:
        self.tokens = self.tokens[at]
        self.per_token = {k: v[at] for k, v in self.per_token.items()}

    def _take_groups(self, at: torch.Tensor) -> None:
        self.groups = self.groups[at]
        self.per_group = {k: v[at] for k, v in self.per_group.items()}

    def _free_groups(self) -> None:
        """Drop the key groups none of whose tokens is in the record."""
        if self.per_group and self.groups.numel():
            live = self.contains_groups()
            if not bool(live.all()):
                self._take_groups(live)

    def contains_groups(self) -> torch.Tensor:
        return torch.isin(self.groups, self.group_keys(self.tokens))

    def clear(self) -> None:
        self._take_tokens(self.tokens[:0])
        self._take_groups(self.groups[:0])

    def keep(self, held: torch.Tensor) -> None:
        """Drop the tokens whose keys are not in ``held`` (evicted), and the key groups left with none."""
        live = torch.isin(self.tokens, held)
        if not bool(live.all()):
            self._take_tokens(live)
            self._free_groups()

    def add(self, tokens: torch.Tensor, k_codes: torch.Tensor, v_codes: torch.Tensor, v_scale: torch.Tensor,
            v_zero: torch.Tensor, k_scale: torch.Tensor, k_zero: torch.Tensor, groups: torch.Tensor | None = None
            ) -> None:
        """Add quantized tokens: codes unpacked ``[k, d]``/``[k, dv]``; the key scales and zeros per token
        (``per_token``) or per group of ``groups [g]`` (``kivi``). ``RuntimeError`` if a token (or a key
        group) is in the record already: nothing is quantized twice."""
        bits = self.quant.bits
        new = {"k_codes": pack(k_codes, bits), "v_codes": pack(v_codes, bits), "v_scale": v_scale, "v_zero": v_zero}
        if groups is None:
            new.update(k_scale=k_scale, k_zero=k_zero)
        else:
            self.groups, order = self._merged(self.groups, groups, "key group")
            self.per_group = {"k_scale": torch.cat([self.per_group["k_scale"], k_scale])[order],
                              "k_zero": torch.cat([self.per_group["k_zero"], k_zero])[order]}
        self.tokens, order = self._merged(self.tokens, tokens, "token")
        self.per_token = {k: torch.cat([v, new[k].to(v.dtype)])[order] for k, v in self.per_token.items()}

    @staticmethod
    def _merged(old: torch.Tensor, new: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        keys, order = torch.cat([old, new]).sort()
        if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
            raise RuntimeError(f"quantized store: a {what} quantized twice")
        return keys, order

    def set_values(self, tokens: torch.Tensor, v_codes: torch.Tensor, v_scale: torch.Tensor,
                   v_zero: torch.Tensor) -> None:
        """Rewrite the value entries of ``tokens`` (in the record): codes unpacked ``[k, dv]``."""
        at = self.index(tokens)
        self.per_token["v_codes"][at] = pack(v_codes, self.quant.bits)
        self.per_token["v_scale"][at] = v_scale
        self.per_token["v_zero"][at] = v_zero

    # ---------------------------------------------------------------- batch rows

    def _rows_of(self, keys: torch.Tensor) -> torch.Tensor:
        return (keys >> SHIFT) // self.heads

    def _relabel(self, keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return (((rows * self.heads + (keys >> SHIFT) % self.heads)) << SHIFT) | (keys & LOW)

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only batch rows ``rows``, row ``rows[i]`` becoming row ``i`` (a ragged batch's finished requests
        leave)."""
        span = max([*rows, int(self._rows_of(self.tokens).max()) if self.count else 0]) + 1
        new = torch.full((span,), -1, dtype=torch.long, device=self.tokens.device)
        new[torch.tensor(rows, dtype=torch.long, device=new.device)] = torch.arange(len(rows), device=new.device)
        for name, take in (("tokens", self._take_tokens), ("groups", self._take_groups)):
            keys = getattr(self, name)
            to = new[self._rows_of(keys)]
            kept = to >= 0
            relabeled, order = self._relabel(keys[kept], to[kept]).sort()
            take(kept.nonzero().squeeze(-1)[order])
            setattr(self, name, relabeled)

    def row(self, r: int) -> "LayerRecord":
        """A copy of batch row ``r``'s entries as row 0 of a record of its own."""
        out = LayerRecord(self.quant, self.heads, self.d, self.dv, self.dtype, self.tokens.device)
        out.tokens, out.groups = self.tokens, self.groups
        out.per_token, out.per_group = dict(self.per_token), dict(self.per_group)
        out.keep_rows([r])
        return out

    def load_row(self, r: int, other: "LayerRecord") -> None:
        """Add ``other``'s row-0 entries as batch row ``r`` (row ``r`` holds none yet)."""
        row = torch.full_like(other.tokens, r)
        t = other.per_token
        tokens = self._relabel(other.tokens, row)
        self.tokens, order = self._merged(self.tokens, tokens, "token")
        self.per_token = {k: torch.cat([v, t[k]])[order] for k, v in self.per_token.items()}
        if self.per_group:
            groups = self._relabel(other.groups, torch.full_like(other.groups, r))
            self.groups, order = self._merged(self.groups, groups, "key group")
            self.per_group = {k: torch.cat([v, other.per_group[k]])[order] for k, v in self.per_group.items()}
