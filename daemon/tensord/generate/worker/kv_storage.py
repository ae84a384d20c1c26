"""The bytes of the paged KV cache: per layer, a key pool and a value pool of blocks.

Layout (shared with the CUDA kernels in kernels/kv_cache.cu): each pool is
[num_blocks, kv_heads, block_size, head_dim] in the model's float dtype. Block j of a
sequence's block table holds its positions [j*block_size, (j+1)*block_size). The block
pool (block_pool.py) decides which block ids a sequence owns; this module only moves
bytes: gather block tables into the contiguous, right-aligned past tensors a model takes,
and scatter the keys and values a step produced back into blocks.
"""

from __future__ import annotations

import itertools
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

    @property
    def nbytes(self) -> int:
        """Bytes held by every pool."""
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def gather(
        self, tables: Sequence[Sequence[int]], lengths: Sequence[int], width: int
    ) -> list[np.ndarray]:
        """Past keys and values [key 0, value 0, key 1, ...], each [B, kv_heads, width,
        head_dim]: sequence b's first lengths[b] positions right-aligned (in the last
        lengths[b] columns), zeros before them."""
        index, blocks = _block_index(tables, lengths, width, self.block_size)
        return [
            kv_gather(pool, index, lengths, width, blocks)
            for layer in self.layers
            for pool in layer
        ]

    def scatter(
        self,
        tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        counts: Sequence[int],
        new: Sequence[np.ndarray],
        offset: int,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Write new = [keys 0, values 0, keys 1, ...], each [B', kv_heads, >= offset + T,
        head_dim], positions offset + t for t < counts[b] of batch row rows[b] (default b),
        into sequence b's positions starts[b] + t."""
        bs = self.block_size
        pools = [pool for layer in self.layers for pool in layer]
        batch = np.arange(len(counts)) if rows is None else np.asarray(rows, np.intp)
        if len(counts) == 1 and counts[0] == 1:  # one sequence's decode: plain slices
            block, slot, row = tables[0][starts[0] // bs], starts[0] % bs, int(batch[0])
            for pool, fresh in zip(pools, new, strict=True):
                pool[block, :, slot, :] = fresh[row, :, offset, :]
            return
        if len(counts) and min(counts) == max(counts) == 1:  # a decode step: one token each
            blocks = np.array([t[s // bs] for t, s in zip(tables, starts, strict=True)], np.int64)
            slots = np.array(starts, np.int64) % bs
            for pool, fresh in zip(pools, new, strict=True):
                pool[blocks, :, slots, :] = fresh[batch, :, offset, :]
            return
        items, cols, blocks, slots = scatter_index(tables, starts, counts, bs)
        if not len(items):
            return
        cols += offset
        for pool, fresh in zip(pools, new, strict=True):
            pool[blocks, :, slots, :] = fresh[batch[items], :, cols, :]


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
    """One pool's gather: [B, heads, width, dim], each sequence right-aligned, zeros before."""
    b, (_, heads, block_size, dim) = index.shape[0], pool.shape
    if all(length == width for length in lengths):
        return np.ascontiguousarray(
            pool[index]
            .transpose(0, 2, 1, 3, 4)
            .reshape(b, heads, blocks * block_size, dim)[:, :, :width]
        )
    # Whole blocks first (one fancy index), then each row into place: as fast as the
    # left-aligned gather, and faster than indexing every position.
    gathered = pool[index].transpose(0, 2, 1, 3, 4).reshape(b, heads, blocks * block_size, dim)
    out = np.empty((b, heads, width, dim), pool.dtype)
    for row, length in enumerate(lengths):
        out[row, :, : width - length] = 0
        out[row, :, width - length :] = gathered[row, :, :length]
    return out


def scatter_index(
    tables: Sequence[Sequence[int]], starts: Sequence[int], counts: Sequence[int], block_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(batch rows, new-token columns, block ids, slots in block) of every token to write."""
    count = np.maximum(np.asarray(counts, np.int64), 0)
    rows = np.repeat(np.arange(len(count)), count)
    cols = np.arange(len(rows)) - (np.cumsum(count) - count)[rows]
    positions = np.asarray(starts, np.int64)[rows] + cols
    lengths = np.array([len(t) for t in tables], np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(tables), np.int64, int(lengths.sum()))
    blocks = flat[(np.cumsum(lengths) - lengths)[rows] + positions // block_size]
    return rows, cols, blocks, positions % block_size
