"""Decode views: assembled from the pool and from last step's view, patched in place when
sequences leave and join, and rebuilt when a patch cannot hold them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from tensord.generate.worker.decode_view import TRIM_SLACK, DecodeView, assemble, patch
from tensord.generate.worker.kv_storage import HostKVStorage, KVShape


@dataclass
class Item:
    request_id: str
    start_pos: int
    block_ids: list[int] = field(default_factory=list)


def _storage() -> HostKVStorage:
    """48 blocks of 4; every pool holds distinct values."""
    storage = HostKVStorage(KVShape(2, 2, 3, np.dtype(np.float32)), num_blocks=48, block_size=4)
    rng = np.random.default_rng(0)
    for layer in storage.layers:
        for pool in layer:
            pool[:] = rng.standard_normal(pool.shape)
    return storage


def _items(**lengths: int) -> dict[str, Item]:
    """Sequences by id with their lengths; sequence i owns blocks 8i..8i+7."""
    return {
        rid: Item(rid, n, list(range(8 * i, 8 * i + 8)))
        for i, (rid, n) in enumerate(lengths.items())
    }


def _rows_match_pool(view: DecodeView, storage: HostKVStorage, items: dict[str, Item]) -> None:
    for r, rid in enumerate(view.request_ids):
        if rid is None:
            continue
        item = items[rid]
        want = storage.reserve(1, view.width)
        storage.gather([item.block_ids], [item.start_pos], want)
        assert view.lengths[r] == item.start_pos
        assert view.mask[r].tolist() == [0] * (view.width - item.start_pos) + [1] * item.start_pos
        for j, tensor in enumerate(view.past):
            np.testing.assert_array_equal(tensor[r], want[j][0])


def test_assembled_from_the_pool_right_aligned() -> None:
    storage = _storage()
    items = _items(a=5, b=9, c=2)
    view = assemble(list(items.values()), [], storage)
    assert (view.request_ids, view.width, len(view.past)) == (["a", "b", "c"], 9, 4)
    _rows_match_pool(view, storage, items)


def test_a_newcomer_takes_a_leavers_row_in_place() -> None:
    storage = _storage()
    items = _items(a=5, b=9, c=2)
    view = assemble(list(items.values()), [], storage)
    arrays = [id(t) for t in view.past]
    changed = _items(a=5, b=9, d=7)  # c left, d joined (d owns c's old blocks: index 2)
    patched = patch(view, changed, storage, free_rows=True)
    assert patched is view and [id(t) for t in view.past] == arrays
    assert view.request_ids == ["a", "b", "d"]
    _rows_match_pool(view, storage, changed)


def test_a_leaver_without_a_newcomer_leaves_a_free_row() -> None:
    storage = _storage()
    items = _items(a=5, b=9, c=2, e=4)
    view = assemble(list(items.values()), [], storage)
    patched = patch(view, {k: items[k] for k in ("a", "b", "e")}, storage, free_rows=True)
    assert patched is view and view.request_ids == ["a", "b", None, "e"]
    assert (view.lengths[2], view.mask[2].any(), view.active()) == (0, False, [0, 1, 3])


@pytest.mark.parametrize(
    ("lengths", "why"),
    [
        ({"a": 5, "b": 9, "d": 3, "f": 4}, "more newcomers than free rows"),
        ({"a": 5, "b": 9, "d": 12}, "a newcomer longer than the width"),
        ({"a": 5}, "too many free rows"),
    ],
)
def test_patches_that_cannot_hold_return_none(lengths: dict[str, int], why: str) -> None:
    storage = _storage()
    view = assemble(list(_items(a=5, b=9, c=2).values()), [], storage)
    assert patch(view, _items(**lengths), storage, free_rows=True) is None, why


def test_a_width_far_beyond_the_longest_is_rebuilt() -> None:
    storage = _storage()
    items = _items(a=3, b=4 + TRIM_SLACK + 1, c=2, e=4)
    view = assemble(list(items.values()), [], storage)
    rest = {k: items[k] for k in ("a", "c", "e")}
    assert patch(view, rest, storage, free_rows=True) is None


def test_without_free_rows_only_the_same_sequences_fit() -> None:
    storage = _storage()
    items = _items(a=5, b=9)
    view = assemble(list(items.values()), [], storage)
    assert patch(view, items, storage, free_rows=False) is view
    assert patch(view, {"a": items["a"]}, storage, free_rows=False) is None


def test_kept_rows_come_from_the_old_view_not_the_pool() -> None:
    """A sequence that decoded last step is copied from that step's view (which holds its
    newest token already), in the old row order, and newcomers follow."""
    storage = _storage()
    items = _items(a=5, b=9, c=2)
    old = assemble(list(items.values()), [], storage)
    for tensor in old.past:
        tensor[1] += 100.0  # b's row in the view differs from the pool now
    changed = _items(a=5, b=9, c=2, d=11)
    view = assemble([changed[k] for k in ("d", "c", "b")], [old], storage)
    assert view.request_ids == ["b", "c", "d"] and view.width == 11
    np.testing.assert_array_equal(view.past[0][0, :, 2:], old.past[0][1])
    assert not view.past[0][0, :, :2].any()
    _rows_match_pool(
        DecodeView([None, "c", "d"], [0, 2, 11], view.mask, view.past), storage, changed
    )
