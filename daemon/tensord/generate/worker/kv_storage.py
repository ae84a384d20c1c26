"""The bytes of the paged KV cache: per layer, a key pool and a value pool of blocks.

`KVStorage` is what the model runner asks of wherever the bytes live: reserve past
tensors, gather block tables into them, scatter a step's new keys and values back.
`HostKVStorage` keeps them in host memory (NumPy); device memory on an executor lane
would be a second implementation of the same interface, not a second execution path.

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
from typing import Protocol

import numpy as np

from tensord.kernels.kv import kv_gather


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


class KVStorage(Protocol):
    """Where a model's KV bytes live, as the model runner and its decode views use them.

    Past tensors are [key 0, value 0, key 1, ...], each [B, kv_heads, width, head_dim];
    a sequence's past is right-aligned (its last columns), zeros before."""

    shape: KVShape
    num_blocks: int
    block_size: int

    def reserve(self, batch: int, width: int) -> list[np.ndarray]:
        """Uninitialised past tensors for `batch` sequences of `width` positions."""
        ...

    def gather(
        self, tables: Sequence[Sequence[int]], lengths: Sequence[int], out: Sequence[np.ndarray]
    ) -> None:
        """Fill `out` (past tensors, or rows of one) with each sequence's first
        lengths[b] positions, right-aligned."""
        ...

    def scatter(
        self,
        tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        counts: Sequence[int],
        new: Sequence[np.ndarray],
        offset: int,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Write a step's new keys and values (the model's `present` outputs) into blocks."""
        ...


class HostKVStorage:
    """KVStorage in host memory: `layers[i] = (keys, values)`, allocated once."""

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

    def reserve(self, batch: int, width: int) -> list[np.ndarray]:
        """Uninitialised past tensors [key 0, value 0, key 1, ...], each [batch, kv_heads,
        width, head_dim], for a gather or a decode view to fill."""
        dims = (batch, self.shape.kv_heads, width, self.shape.head_dim)
        return [np.empty(dims, self.shape.dtype) for _ in range(2 * self.shape.num_layers)]

    def gather(
        self, tables: Sequence[Sequence[int]], lengths: Sequence[int], out: Sequence[np.ndarray]
    ) -> None:
        """Fill out = [key 0, value 0, key 1, ...], each [B, kv_heads, width, head_dim]:
        sequence b's first lengths[b] positions right-aligned (in the last lengths[b]
        columns), zeros before them."""
        width = out[0].shape[2] if out else 0
        index = block_tables(tables, lengths, width, self.block_size)
        seq_lens = np.asarray(lengths, np.int32)
        for pool, past in zip((p for layer in self.layers for p in layer), out, strict=True):
            kv_gather(pool, index, seq_lens, past)

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


def block_tables(
    tables: Sequence[Sequence[int]], lengths: Sequence[int], width: int, block_size: int
) -> np.ndarray:
    """int32 [B, blocks] block ids covering `width` positions, -1 where a table is shorter
    (the kernels' layout)."""
    blocks = -(-width // block_size)
    index = np.full((len(tables), blocks), -1, np.int32)
    for b, (table, length) in enumerate(zip(tables, lengths, strict=True)):
        used = -(-length // block_size)
        index[b, :used] = table[:used]
    return index


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
