"""Prefix reuse on KV slots: what the index owes (saves after a step, loads before the next)
on a store of blocks of 4 tokens, and the bytes the store copies to and from slots."""

from __future__ import annotations

import numpy as np

from tensord.generate.core.request import Request
from tensord.generate.core.slot_manager import SlotManager
from tensord.generate.core.slot_prefix import PrefixCopy, SlotPrefixIndex
from tensord.generate.worker.kv_slots import SlotLayout, SlotStorage
from tensord.generate.worker.prefix_store import PrefixStore
from tests.unit.generate.helpers import make_request


def _manager(store_blocks: int = 8, held: int | None = None) -> SlotManager:
    return SlotManager(4, 64, SlotPrefixIndex(store_blocks, 4, held))


def _admit(manager: SlotManager, request: Request) -> int:
    """Lookup, a slot, and the prompt 'computed' at once; the tokens taken from the store."""
    hits, hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - hit, hits) == []
    request.num_computed_tokens = request.num_tokens
    manager.cache_blocks(request)
    return hit


def _drain(manager: SlotManager) -> tuple[list[PrefixCopy], list[PrefixCopy]]:
    """The saves and loads owed, both done."""
    assert manager.prefix is not None
    saves, saving = manager.prefix.take_saves()
    manager.prefix.saved(saving, done=True)
    loads = manager.prefix.take_loads()
    manager.prefix.loaded(loads)
    return saves, [load.copy for load in loads]


def test_full_blocks_are_saved_once_and_later_prompts_load_them() -> None:
    manager = _manager()
    a = make_request("a", list(range(1, 11)))  # 10 tokens: 2 full blocks
    assert _admit(manager, a) == 0
    saves, loads = _drain(manager)
    assert saves == [PrefixCopy(0, 0, (0, 1))] and loads == []
    b = make_request("b", [*range(1, 9), 50, 51, 52])  # shares 2 blocks (8 tokens)
    assert _admit(manager, b) == 8
    saves, loads = _drain(manager)
    assert loads == [PrefixCopy(1, 0, (0, 1))]
    assert saves == []  # b's third block is not full
    stats = manager.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (21, 8)
    # generated tokens fill b's third block: it is saved after the step that wrote it
    b.append_output_token(53)
    b.num_computed_tokens = 12
    manager.cache_blocks(b)
    assert _drain(manager)[0] == [PrefixCopy(1, 2, (2,))]


def test_the_last_prompt_token_is_always_computed() -> None:
    manager = _manager()
    _admit(manager, make_request("a", list(range(1, 9))))
    _drain(manager)
    same = make_request("b", list(range(1, 9)))  # 8 tokens, both blocks stored
    hits, hit = manager.get_computed_blocks(same)
    assert hit == 4 and len(hits) == 1  # its last token's pass yields the next logits


def test_a_ring_layer_bounds_the_prefix_taken_and_stored() -> None:
    manager = _manager(held=9)
    a = make_request("a", list(range(1, 9)))
    _admit(manager, a)  # 8 tokens: held as they are
    assert _drain(manager)[0] == [PrefixCopy(0, 0, (0, 1))]
    assert manager.get_computed_blocks(make_request("b", list(range(1, 14))))[1] == 8
    # past 9 tokens the ring has overwritten positions: no block of it is stored again
    c = make_request("c", list(range(50, 62)))
    _admit(manager, c)  # 12 tokens in one pass
    assert _drain(manager)[0] == []
    c.append_output_token(7)
    c.num_computed_tokens = 13
    manager.cache_blocks(c)
    assert _drain(manager)[0] == []
    assert manager.get_computed_blocks(make_request("d", list(range(50, 62))))[1] == 0


def test_least_recently_used_blocks_make_room_and_loading_ones_stay() -> None:
    manager = _manager(store_blocks=2)
    _admit(manager, make_request("a", list(range(1, 10))))
    _drain(manager)
    b = make_request("b", [*range(1, 9), 7])
    assert _admit(manager, b) == 8  # a's two blocks, held until loaded
    assert manager.prefix is not None
    loads = manager.prefix.take_loads()
    c = make_request("c", list(range(100, 109)))
    _admit(manager, c)  # no block to take while both are being loaded: nothing saved
    assert manager.prefix.take_saves()[0] == []
    manager.prefix.loaded(loads)
    c.num_computed_tokens = 9
    manager.cache_blocks(c)  # after the load: c's blocks take the least recently used
    saves, saving = manager.prefix.take_saves()
    assert saves == [PrefixCopy(2, 0, (1, 0))]  # a's last block went first
    # not found before its bytes are in
    assert manager.get_computed_blocks(make_request("e", list(range(100, 109))))[1] == 0
    manager.prefix.saved(saving, done=True)
    assert manager.get_computed_blocks(make_request("e", list(range(100, 109))))[1] == 8
    assert manager.get_computed_blocks(make_request("d", list(range(1, 10))))[1] == 0


def test_one_step_saves_no_more_than_the_store_holds() -> None:
    manager = _manager(store_blocks=2)
    long = make_request("long", list(range(1, 26)))  # 6 full blocks
    _admit(manager, long)
    assert manager.prefix is not None
    saves, saving = manager.prefix.take_saves()
    assert saves == [PrefixCopy(0, 0, (0, 1))]  # the first two; the rest after the copy
    manager.prefix.saved(saving, done=True)
    assert manager.get_computed_blocks(make_request("x", list(range(1, 26))))[1] == 8
    # Its next blocks would evict its first ones and never be found: none is stored.
    long.append_output_token(9)
    long.num_computed_tokens = 26
    manager.cache_blocks(long)
    assert manager.prefix.take_saves()[0] == []
    assert manager.get_computed_blocks(make_request("y", list(range(1, 26))))[1] == 8


def test_a_failed_save_is_never_found() -> None:
    manager = _manager()
    _admit(manager, make_request("a", list(range(1, 10))))
    assert manager.prefix is not None
    _, saving = manager.prefix.take_saves()
    manager.prefix.saved(saving, done=False)
    assert manager.get_computed_blocks(make_request("b", list(range(1, 10))))[1] == 0
    assert manager.prefix.pool.get_num_free_blocks() == 8  # nothing held


def test_a_freed_slot_is_forgotten_and_stats_count_the_store() -> None:
    manager = _manager()
    a = make_request("a", list(range(1, 10)))
    _admit(manager, a)
    manager.free(a)
    a.num_computed_tokens = 20
    a.append_output_token(5)
    manager.cache_blocks(a)  # no slot: nothing more owed
    saves, _ = _drain(manager)
    assert saves == [PrefixCopy(0, 0, (0, 1))]
    store = manager.prefix_stats()
    assert store is not None
    assert (store.total_blocks, store.cached_blocks, store.used_blocks) == (8, 2, 0)


def _storage(lengths: tuple[int, ...] = (16, 16)) -> SlotStorage:
    layout = SlotLayout(len(lengths), 2, 3, np.dtype(np.float32), lengths)
    storage = SlotStorage(layout, num_slots=3)
    rng = np.random.default_rng(0)
    for layer in range(len(lengths)):
        for kind in (0, 1):
            view = storage.host_view(layer, kind)
            view[...] = rng.standard_normal(view.shape, np.float32)
    return storage


def test_blocks_saved_from_one_slot_load_into_another_as_they_were() -> None:
    storage = _storage()
    store = PrefixStore(storage.layout, 6, 4, windows=(None, None))
    store.save(storage, [PrefixCopy(0, 0, (4, 1)), PrefixCopy(0, 2, (3,))])
    before = [storage.host_view(layer, kind)[2].copy() for layer in (0, 1) for kind in (0, 1)]
    store.load(storage, [PrefixCopy(2, 0, (4, 1, 3))])
    for n, (layer, kind) in enumerate((lay, k) for lay in (0, 1) for k in (0, 1)):
        view = storage.host_view(layer, kind)
        np.testing.assert_array_equal(view[2, :, :12], view[0, :, :12])
        np.testing.assert_array_equal(view[2, :, 12:], before[n][:, 12:])  # untouched
    block = 2 * 2 * 4 * 3 * 4  # keys and values, 2 heads, 4 positions, 3 dims, float32
    assert store.bytes_saved == store.bytes_loaded == 2 * 3 * block  # 2 layers, 3 blocks


def test_a_windowed_layer_loads_only_what_its_window_reaches() -> None:
    storage = _storage()
    store = PrefixStore(storage.layout, 6, 4, windows=(None, 5))
    store.save(storage, [PrefixCopy(0, 0, (0, 1, 2))])
    old = storage.host_view(1, 0)[1].copy()
    store.load(storage, [PrefixCopy(1, 0, (0, 1, 2))])
    full, windowed = storage.host_view(0, 0), storage.host_view(1, 0)
    np.testing.assert_array_equal(full[1, :, :12], full[0, :, :12])
    # 12 tokens, a window of 5 (and one of slack): positions 6.. are read, blocks 1 and 2
    np.testing.assert_array_equal(windowed[1, :, 4:12], windowed[0, :, 4:12])
    np.testing.assert_array_equal(windowed[1, :, :4], old[:, :4])
