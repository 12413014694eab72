"""A prefill chunk size B: a number of tokens, or ``whole`` (one chunk holds everything that is compressed).

``whole`` is one-shot compression, the reference every other tool uses (kvpress prefills the whole prompt,
then compresses it once): the compressed part (the prompt under ``compress: prompt``, the context under
``compress: context``) is fed as a single chunk and evicted to the budget once. The runner resolves it per
sample (:func:`resolve_chunk`). Its peak KV memory is not bounded by ``N + B``: it grows with the prompt.

A grid, a cell's spec and its id hold the text ``"whole"``; the index and the Parquet rows, whose
``chunk_size`` column is an integer, hold :data:`WHOLE_CODE` (0, never a valid token count).
"""
from __future__ import annotations

from typing import Any, Union

#: The chunk size that holds everything compressed in one chunk.
WHOLE = "whole"
#: ``whole`` in the integer ``chunk_size`` column of the index and of result rows.
WHOLE_CODE = 0

#: A cell's chunk size: B tokens or :data:`WHOLE`.
ChunkSize = Union[int, str]

CHUNK_EXPECTED = f"expected a positive number of tokens or '{WHOLE}' (one chunk: compress once, after a full prefill)"


def parse_chunk(value: Any) -> int | str:
    """``value`` as a chunk size: an int as it is (the engine's rule checks its range) or :data:`WHOLE`;
    ValueError(:data:`CHUNK_EXPECTED`) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() == WHOLE:
        return WHOLE
    raise ValueError(CHUNK_EXPECTED)


def is_whole(chunk: Any) -> bool:
    """Whether ``chunk`` is one-shot: :data:`WHOLE` or its stored code."""
    return chunk == WHOLE or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk == WHOLE_CODE)


def chunk_code(chunk: ChunkSize) -> int:
    """The integer stored for ``chunk`` (B itself, :data:`WHOLE_CODE` for ``whole``)."""
    return WHOLE_CODE if is_whole(chunk) else int(chunk)


def chunk_text(chunk: Any) -> str:
    """``128`` or ``whole`` (from a spec's value or a stored code)."""
    return WHOLE if is_whole(chunk) else str(chunk)


def resolve_chunk(chunk: ChunkSize, compressed_tokens: int) -> int:
    """The B a sample runs with: ``chunk`` itself (the engine checks it), or for :data:`WHOLE` the number of
    tokens compressed (at least 1). Only the text means ``whole`` here, not its stored code."""
    return max(1, int(compressed_tokens)) if chunk == WHOLE else chunk
