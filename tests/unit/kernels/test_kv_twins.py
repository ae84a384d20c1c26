"""The paged KV gather/scatter twins: the shared layout, by hand and by brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tensord.kernels import kv_gather, kv_scatter


def small_pool() -> np.ndarray:
    """pool[4 blocks, 1 head, block_size 2, D 1] = 100 + 10 * block + slot."""
    return (
        (100 + 10 * np.arange(4)[:, None] + np.arange(2)[None, :])
        .astype(np.float32)
        .reshape(4, 1, 2, 1)
    )


def test_gather_by_hand() -> None:
    tables = np.array([[2, 0, -1], [3, -1, -1]], np.int32)
    out = np.full((2, 1, 4, 1), np.nan, np.float32)
    result = kv_gather(small_pool(), tables, np.array([3, 1], np.int32), out)
    assert result is out
    # Right-aligned: each sequence ends in the last column, zeros before it.
    assert out[:, 0, :, 0].tolist() == [[0, 120, 121, 100], [0, 0, 0, 130]]


def test_scatter_by_hand() -> None:
    pool = small_pool()
    tables = np.array([[2, 0, 1], [3, -1, -1]], np.int32)
    new = np.array([[7, 8], [9, -5]], np.float32).reshape(2, 1, 2, 1)
    kv_scatter(new, tables, np.array([3, 1], np.int32), np.array([2, 1], np.int32), pool)
    assert pool[:, 0, :, 0].tolist() == [[100, 7], [8, 111], [120, 121], [130, 9]]


def test_round_trip_against_brute_force() -> None:
    rng = np.random.default_rng(9)
    nb, h, bs, d, batch, max_blocks = 20, 3, 4, 5, 3, 5
    pool = rng.normal(size=(nb, h, bs, d)).astype(np.float32)
    tables = np.full((batch, max_blocks), -1, np.int32)
    perm = rng.permutation(nb)[: batch * max_blocks].reshape(batch, max_blocks)
    lens = np.array([7, 0, 18], np.int32)
    for b in range(batch):
        used = -(-int(lens[b] + 2) // bs)
        tables[b, :used] = perm[b, :used]
    out = np.full((batch, h, 19, d), np.nan, np.float32)
    kv_gather(pool, tables, lens, out)
    for b in range(batch):
        pad = 19 - int(lens[b])
        for c in range(19):
            t = c - pad
            want = pool[tables[b, t // bs], :, t % bs, :] if t >= 0 else 0
            np.testing.assert_array_equal(out[b, :, c, :], want)
    new = rng.normal(size=(batch, h, 2, d)).astype(np.float32)
    before = pool.copy()
    kv_scatter(new, tables, lens, np.array([2, 1, 2], np.int32), pool)
    expected = before.copy()
    for b, count in enumerate([2, 1, 2]):
        for t in range(count):
            p = lens[b] + t
            expected[tables[b, p // bs], :, p % bs, :] = new[b, :, t, :]
    np.testing.assert_array_equal(pool, expected)


def test_bad_tables_are_refused() -> None:
    tables = np.array([[2, -1]], np.int32)
    out = np.zeros((1, 1, 4, 1), np.float32)
    with pytest.raises(ValueError, match="block table entry 1 is -1"):
        kv_gather(small_pool(), tables, np.array([3], np.int32), out)
    with pytest.raises(ValueError, match=r"seq_lens must be within 0\.\.4"):
        kv_gather(small_pool(), tables, np.array([5], np.int32), out)
    with pytest.raises(ValueError, match="needs block table entry 2"):
        kv_scatter(
            np.zeros((1, 1, 2, 1), np.float32), tables, np.array([3], np.int32),
            np.array([2], np.int32), small_pool(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="block_tables must be int32"):
        kv_gather(small_pool(), tables.astype(np.int64), np.array([1], np.int32), out)
