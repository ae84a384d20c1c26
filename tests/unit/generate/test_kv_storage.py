"""The KV pool's bytes: scatter then gather gives back exactly what was written, each
sequence right-aligned in the gathered past."""

from __future__ import annotations

import numpy as np

from tensord.generate.worker.kv_storage import HostKVStorage, KVShape


def _flat(pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """[(keys 0, values 0), ...] as the storage takes them: [keys 0, values 0, keys 1, ...]."""
    return [array for pair in pairs for array in pair]


def _storage() -> HostKVStorage:
    return HostKVStorage(KVShape(2, 2, 3, np.dtype(np.float32)), num_blocks=8, block_size=4)


def _gathered(
    storage: HostKVStorage, tables: list[list[int]], lengths: list[int], width: int
) -> list[np.ndarray]:
    """The pasts gathered into fresh tensors (NaN first, so unwritten columns show)."""
    out = storage.reserve(len(tables), width)
    for past in out:
        past.fill(np.nan)
    storage.gather(tables, lengths, out)
    return out


def test_scatter_then_gather_round_trip() -> None:
    storage = _storage()
    rng = np.random.default_rng(0)
    tables = [[5, 2, 7], [1]]
    lengths = [10, 3]
    # A prefill of 10 and 3 tokens after a right-padded "past" of width 2.
    new = [
        (
            rng.standard_normal((2, 2, 12, 3), np.float32),
            rng.standard_normal((2, 2, 12, 3), np.float32),
        )
        for _ in range(2)
    ]
    storage.scatter(tables, [0, 0], lengths, _flat(new), offset=2)
    # Position 5 of sequence 0 lives in block 2 (its second block), slot 1.
    k0 = storage.layers[0][0]
    assert np.array_equal(k0[2, :, 1, :], new[0][0][0, :, 2 + 5, :])
    assert np.array_equal(k0[1, :, 2, :], new[0][0][1, :, 2 + 2, :])
    assert not k0[0].any() and not k0[3].any()  # blocks nobody owns stay untouched
    past = _gathered(storage, tables, lengths, width=11)
    for layer in range(2):
        for which in range(2):
            got = past[2 * layer + which]
            assert got.shape == (2, 2, 11, 3) and got.flags.c_contiguous
            assert np.array_equal(got[0, :, 1:], new[layer][which][0, :, 2:12])
            assert np.array_equal(got[1, :, 8:], new[layer][which][1, :, 2:5])
            assert not got[0, :, :1].any() and not got[1, :, :8].any()
    # Sequences that fill the width take the one-copy path; the same bytes.
    full = _gathered(storage, [tables[0]], [10], width=10)
    assert np.array_equal(full[2][0], new[1][0][0, :, 2:12])


def test_scatter_appends_one_position() -> None:
    storage = _storage()
    step = [(np.full((1, 2, 5, 3), 7, np.float32), np.full((1, 2, 5, 3), 8, np.float32))] * 2
    storage.scatter([[3, 6]], [4], [1], _flat(step), offset=4)  # position 4: block 6, slot 0
    assert (storage.layers[1][0][6, :, 0] == 7).all() and (storage.layers[1][1][6, :, 0] == 8).all()
    assert storage.layers[1][0][6, :, 1:].sum() == 0 and storage.layers[1][0][3].sum() == 0
    assert storage.nbytes == 2 * 2 * 8 * 2 * 4 * 3 * 4


def test_storage_agrees_with_the_kernel_twins() -> None:
    """HostKVStorage (vectorised, what the engine runs on the host) and the NumPy twins of
    kernels/kv_cache.cu (the reference the CUDA kernels are checked against) agree."""
    from tensord.kernels.kv import kv_gather, kv_scatter

    rng = np.random.default_rng(7)
    storage = _storage()
    tables = [[6, 1, 3], [0, 5, -1]]
    starts, counts = [2, 0], [9, 6]
    new = [
        (
            rng.standard_normal((2, 2, 10, 3), np.float32),
            rng.standard_normal((2, 2, 10, 3), np.float32),
        )
        for _ in range(2)
    ]
    storage.scatter(tables, starts, counts, _flat(new), offset=1)
    twin_pools = [(np.zeros_like(k), np.zeros_like(v)) for k, v in storage.layers]
    tables32 = np.array(tables, np.int32)
    for (k_pool, v_pool), (k_new, v_new) in zip(twin_pools, new, strict=True):
        for pool, fresh in ((k_pool, k_new), (v_pool, v_new)):
            kv_scatter(
                np.ascontiguousarray(fresh[:, :, 1:]),
                tables32,
                np.array(starts, np.int32),
                np.array(counts, np.int32),
                pool,
            )
    for (k, v), (tk, tv) in zip(storage.layers, twin_pools, strict=True):
        assert np.array_equal(k, tk) and np.array_equal(v, tv)
    lengths = [11, 6]
    gathered = _gathered(storage, tables, lengths, width=12)
    for layer, (k_pool, _) in enumerate(storage.layers):
        out = np.full((2, 2, 12, 3), np.nan, np.float32)
        kv_gather(k_pool, tables32, np.array(lengths, np.int32), out)
        assert np.array_equal(gathered[2 * layer], out)


def test_batched_decode_scatter_agrees_with_the_twin() -> None:
    """A decode step of several sequences (one token each, the engine's common case) writes
    what the kernel twin writes, at each sequence's own position."""
    from tensord.kernels.kv import kv_scatter

    rng = np.random.default_rng(11)
    storage = _storage()
    tables = [[6, 1, 3], [0, 5], [2]]
    starts = [9, 4, 3]  # block 3 slot 1, block 5 slot 0, block 2 slot 3
    new = [
        (
            rng.standard_normal((3, 2, 7, 3), np.float32),
            rng.standard_normal((3, 2, 7, 3), np.float32),
        )
        for _ in range(2)
    ]
    storage.scatter(tables, starts, [1, 1, 1], _flat(new), offset=6)
    padded = np.array([t + [-1] * (3 - len(t)) for t in tables], np.int32)
    for (k, v), (k_new, v_new) in zip(storage.layers, new, strict=True):
        for pool, fresh in ((k, k_new), (v, v_new)):
            twin = np.zeros_like(pool)
            kv_scatter(
                np.ascontiguousarray(fresh[:, :, 6:]),
                padded,
                np.array(starts, np.int32),
                np.ones(3, np.int32),
                twin,
            )
            assert np.array_equal(pool, twin)
    assert np.array_equal(storage.layers[1][1][5, :, 0], new[1][1][1, :, 6])
