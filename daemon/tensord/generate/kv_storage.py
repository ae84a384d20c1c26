"""The bytes of the paged KV cache: per layer, a key pool and a value pool of blocks.

Layout (shared with the CUDA kernels in kernels/kv_cache.cu): each pool is
[num_blocks, kv_heads, block_size, head_dim] in the model's float dtype. Block j of a
sequence's block table holds its positions [j*block_size, (j+1)*block_size). The block
pool (block_pool.py) decides which block ids a sequence owns; this module only moves
bytes: gather block tables into the contiguous past tensors a model takes, and scatter
the keys and values a step produced back into blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token's cache entry looks like in a model."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: np.dtype

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of every layer for one token."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype.itemsize


class KVStorage:
    """The pools' memory: `layers[i] = (keys, values)`, allocated once."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        dims = (num_blocks, shape.kv_heads, block_size, shape.head_dim)
        self.layers = [
            (_reserved(dims, shape.dtype), _reserved(dims, shape.dtype))
            for _ in range(shape.num_layers)
        ]

    def _scatter_direct(
        self,
        tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        counts: Sequence[int],
        new: Sequence[tuple[np.ndarray, np.ndarray]],
        offset: int,
    ) -> None:
        bs = self.block_size
        writes = [
            (b, offset + t, tables[b][(start + t) // bs], (start + t) % bs)
            for b, (start, count) in enumerate(zip(starts, counts, strict=True))
            for t in range(count)
        ]
        for (k_pool, v_pool), (k_new, v_new) in zip(self.layers, new, strict=True):
            for row, col, block, slot in writes:
                k_pool[block, :, slot, :] = k_new[row, :, col, :]
                v_pool[block, :, slot, :] = v_new[row, :, col, :]

    @property
    def nbytes(self) -> int:
        """Bytes held by every pool."""
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def gather(
        self, tables: Sequence[Sequence[int]], lengths: Sequence[int], width: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, (past keys, past values) of shape [B, kv_heads, width, head_dim]:
        sequence b's first lengths[b] positions, zeros after them."""
        index, blocks = _block_index(tables, lengths, width, self.block_size)
        return [
            (
                kv_gather(k, index, lengths, width, blocks),
                kv_gather(v, index, lengths, width, blocks),
            )
            for k, v in self.layers
        ]

    def scatter(
        self,
        tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        counts: Sequence[int],
        new: Sequence[tuple[np.ndarray, np.ndarray]],
        offset: int,
    ) -> None:
        """Write new[i] = (keys, values) [B, kv_heads, >= offset + T, head_dim], positions
        offset + t for t < counts[b], into sequence b's positions starts[b] + t."""
        if sum(counts) <= _DIRECT_TOKENS:
            self._scatter_direct(tables, starts, counts, new, offset)
            return
        rows, cols, blocks, slots = scatter_index(tables, starts, counts, self.block_size)
        if not len(rows):
            return
        for (k_pool, v_pool), (k_new, v_new) in zip(self.layers, new, strict=True):
            k_pool[blocks, :, slots, :] = k_new[rows, :, cols + offset, :]
            v_pool[blocks, :, slots, :] = v_new[rows, :, cols + offset, :]


# Up to this many tokens, plain slice assignments beat building fancy indices (decode steps
# of a few sequences); above it, one fancy assignment per pool.
_DIRECT_TOKENS = 4


def _reserved(dims: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros whose pages are committed now: np.zeros maps them lazily, and a pool that
    fills over hours would look like a growing process (and could fail late, not at load)."""
    array = np.empty(dims, dtype)
    array.fill(0)
    return array


def _block_index(
    tables: Sequence[Sequence[int]], lengths: Sequence[int], width: int, block_size: int
) -> tuple[np.ndarray, int]:
    """[B, blocks] block ids covering `width` positions (0 where a table is shorter)."""
    blocks = -(-width // block_size)
    index = np.zeros((len(tables), blocks), np.int64)
    for b, (table, length) in enumerate(zip(tables, lengths, strict=True)):
        used = -(-length // block_size)
        index[b, :used] = table[:used]
    return index, blocks


def kv_gather(
    pool: np.ndarray, index: np.ndarray, lengths: Sequence[int], width: int, blocks: int
) -> np.ndarray:
    """One pool's gather: [B, heads, width, dim], zero beyond each sequence's length."""
    b, (_, heads, block_size, dim) = index.shape[0], pool.shape
    out = np.ascontiguousarray(
        pool[index]
        .transpose(0, 2, 1, 3, 4)
        .reshape(b, heads, blocks * block_size, dim)[:, :, :width]
    )
    for row, length in enumerate(lengths):
        if length < width:
            out[row, :, length:] = 0
    return out


def scatter_index(
    tables: Sequence[Sequence[int]], starts: Sequence[int], counts: Sequence[int], block_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(batch rows, new-token columns, block ids, slots in block) of every token to write."""
    rows, cols, blocks, slots = [], [], [], []
    for b, (table, start, count) in enumerate(zip(tables, starts, counts, strict=True)):
        if count <= 0:
            continue
        positions = np.arange(start, start + count)
        rows.append(np.full(count, b))
        cols.append(np.arange(count))
        blocks.append(np.asarray(table, np.int64)[positions // block_size])
        slots.append(positions % block_size)
    if not rows:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    return tuple(np.concatenate(a) for a in (rows, cols, blocks, slots))  # type: ignore[return-value]
