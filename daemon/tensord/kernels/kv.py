"""NumPy twins of kv_cache.cu: the paged KV cache's gather and scatter.

Layout (shared with the generation engine): per layer, a key pool and a value pool, each
pool[num_blocks, H_kv, block_size, D]; block j of a sequence's block table holds its
positions [j * block_size, (j + 1) * block_size); -1 marks an unused table entry.
"""

from __future__ import annotations

import numpy as np


def _check_common(
    pool: np.ndarray, block_tables: np.ndarray, per_seq: dict[str, np.ndarray]
) -> None:
    if pool.ndim != 4:
        raise ValueError(f"pool must be [num_blocks, H, block_size, D], got {list(pool.shape)}")
    if block_tables.dtype != np.int32 or block_tables.ndim != 2:
        raise ValueError(
            f"block_tables must be int32 [B, max_blocks], got {block_tables.dtype} "
            f"{list(block_tables.shape)}"
        )
    for name, array in per_seq.items():
        if array.dtype != np.int32 or array.shape != (block_tables.shape[0],):
            raise ValueError(
                f"{name} must be int32 [{block_tables.shape[0]}], got {array.dtype} "
                f"{list(array.shape)}"
            )


def _check_dense(name: str, array: np.ndarray, pool: np.ndarray, batch: int, length: str) -> None:
    """`array` must be [batch, H, length, D] in the pool's dtype."""
    _, h, _, d = pool.shape
    if (
        array.dtype != pool.dtype
        or array.ndim != 4
        or array.shape[:2] != (batch, h)
        or (array.shape[3] != d)
    ):
        raise ValueError(
            f"{name} must be {pool.dtype} [{batch}, {h}, {length}, {d}], got {array.dtype} "
            f"{list(array.shape)}"
        )


def _blocks(
    block_tables: np.ndarray, b: int, positions: np.ndarray, bs: int, nb: int
) -> np.ndarray:
    slots = positions // bs
    if slots.size and slots.max() >= block_tables.shape[1]:
        raise ValueError(
            f"sequence {b}: position {int(positions.max())} needs block table entry "
            f"{int(slots.max())}, but the table has {block_tables.shape[1]}"
        )
    ids = block_tables[b, slots]
    bad = (ids < 0) | (ids >= nb)
    if bad.any():
        raise ValueError(
            f"sequence {b}: block table entry {int(slots[bad][0])} is {int(ids[bad][0])}, "
            f"not a block of the pool (0..{nb - 1})"
        )
    return ids


def kv_gather(
    pool: np.ndarray, block_tables: np.ndarray, seq_lens: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """Right-aligned: out[b, :, P_max - seq_lens[b] + t, :] =
    pool[block_tables[b, t // bs], :, t % bs, :] for t < seq_lens[b], 0 in the columns
    before. Writes into out [B, H, P_max, D] and returns it.

    The one gather of a sequence's past from the pool: the engine runs it on the host
    (HostKVStorage), and it is the reference the CUDA kernel is checked against."""
    _check_common(pool, block_tables, {"seq_lens": seq_lens})
    nb, heads, bs, dim = pool.shape
    batch = block_tables.shape[0]
    _check_dense("out", out, pool, batch, "P_max")
    p_max = out.shape[2]
    lens: list[int] = seq_lens.tolist()
    if lens and (min(lens) < 0 or max(lens) > p_max):
        raise ValueError(f"seq_lens must be within 0..{p_max} (P_max), got {lens}")
    if not batch:
        return out
    ids = _used_blocks(block_tables, lens, bs, nb)
    # Each row's whole blocks (one fancy index), then into place: faster than indexing
    # every position, and the per-row temporary stays small enough to be reused.
    for row, length in enumerate(lens):
        blocks = -(-length // bs)
        out[row, :, : p_max - length] = 0
        out[row, :, p_max - length :] = (
            pool[ids[row, :blocks]].transpose(1, 0, 2, 3).reshape(heads, blocks * bs, dim)
        )[:, :length]
    return out


def _used_blocks(block_tables: np.ndarray, lens: list[int], bs: int, nb: int) -> np.ndarray:
    """[B, most blocks used] block ids of each sequence's positions, checked against the
    pool; entries past a sequence's length (often -1) are 0."""
    used = [-(-n // bs) for n in lens]
    need = max(used)
    if need > block_tables.shape[1]:
        b = next(b for b, n in enumerate(used) if n > block_tables.shape[1])
        raise ValueError(
            f"sequence {b}: position {lens[b] - 1} needs block table entry {used[b] - 1}, "
            f"but the table has {block_tables.shape[1]}"
        )
    live = np.arange(need) < np.array(used)[:, None]
    ids = np.where(live, block_tables[:, :need], 0)
    if need and (ids.min() < 0 or ids.max() >= nb):
        b, slot = (int(i) for i in np.argwhere((ids < 0) | (ids >= nb))[0])
        raise ValueError(
            f"sequence {b}: block table entry {slot} is {int(ids[b, slot])}, "
            f"not a block of the pool (0..{nb - 1})"
        )
    return ids


def kv_scatter(
    new: np.ndarray,
    block_tables: np.ndarray,
    start_pos: np.ndarray,
    num_new: np.ndarray,
    pool: np.ndarray,
) -> np.ndarray:
    """For t < num_new[b]: p = start_pos[b] + t;
    pool[block_tables[b, p // bs], :, p % bs, :] = new[b, :, t, :]. Writes into pool and
    returns it."""
    _check_common(pool, block_tables, {"start_pos": start_pos, "num_new": num_new})
    nb, _, bs, _ = pool.shape
    batch = block_tables.shape[0]
    _check_dense("new", new, pool, batch, "T_max")
    t_max = new.shape[2]
    if num_new.size and (num_new.min() < 0 or num_new.max() > t_max):
        raise ValueError(f"num_new must be within 0..{t_max} (T_max), got {num_new.tolist()}")
    if start_pos.size and start_pos.min() < 0:
        raise ValueError(f"start_pos must be >= 0, got {start_pos.tolist()}")
    for b in range(batch):
        n = int(num_new[b])
        p = int(start_pos[b]) + np.arange(n)
        ids = _blocks(block_tables, b, p, bs, nb)
        pool[ids, :, p % bs, :] = new[b, :, :n, :].transpose(1, 0, 2)
    return pool
