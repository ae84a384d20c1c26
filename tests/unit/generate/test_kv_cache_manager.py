"""The KV cache manager on 11 blocks of 4 tokens: tables, prefix hits, ref counts, freeing."""

from __future__ import annotations

from tensord.generate.core.kv_cache_manager import (
    KVCacheManager,
    hash_block_tokens,
    kv_block_bytes,
)
from tensord.generate.core.request import Request
from tests.unit.generate.helpers import make_request


def refs(manager: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in manager.block_pool.blocks]


def free_list(manager: KVCacheManager) -> list[int]:
    return manager.block_pool.free_block_queue.block_ids()


def admit(manager: KVCacheManager, request: Request) -> list[int]:
    """Prefix lookup, then slots for the rest of the prompt; the step 'runs' at once."""
    hits, num_hit = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_hit, hits)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    manager.cache_blocks(request)
    return manager.get_block_ids(request.request_id)


def test_block_table_grows_one_block_at_a_time() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 11)))  # 10 tokens: 3 blocks, the last half full
    assert admit(manager, a) == [0, 1, 2]
    assert refs(manager) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    # two decode tokens fit in block 2; the third needs block 3
    for token in (11, 12):
        assert manager.allocate_slots(a, 1) == []
        a.append_output_token(token)
        a.num_computed_tokens += 1
        manager.cache_blocks(a)
    assert manager.get_block_ids("a") == [0, 1, 2]
    assert manager.stats().cached_blocks == 3  # block 2 is full now
    new = manager.allocate_slots(a, 1)
    assert new is not None and [b.block_id for b in new] == [3]
    stats = manager.stats()
    assert (stats.used_blocks, stats.free_blocks, stats.total_blocks) == (4, 7, 11)
    assert abs(stats.utilisation - 4 / 11) < 1e-12


def test_prefix_hit_shares_full_prompt_blocks_only() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 11)))
    assert admit(manager, a) == [0, 1, 2]
    # b shares a's first 8 tokens: blocks 0 and 1; its third block differs
    b = make_request("b", [*range(1, 9), 50, 51, 52])
    assert admit(manager, b) == [0, 1, 3]
    # c has a's exact 10 tokens: block 2 is only half full, so it is not shared
    c = make_request("c", list(range(1, 11)))
    hits, num_hit = manager.get_computed_blocks(c)
    assert [blk.block_id for blk in hits] == [0, 1] and num_hit == 8
    new = manager.allocate_slots(c, 2, hits)
    assert new is not None and [blk.block_id for blk in new] == [4]
    assert refs(manager)[:5] == [3, 3, 1, 1, 1]
    stats = manager.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (10 + 11 + 10, 0 + 8 + 8)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 9)))  # exactly 2 full blocks
    assert admit(manager, a) == [0, 1]
    b = make_request("b", list(range(1, 9)))
    hits, num_hit = manager.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0] and num_hit == 4
    new = manager.allocate_slots(b, 4, hits)
    assert new is not None and [blk.block_id for blk in new] == [2]


def test_freeing_is_tail_first_and_keeps_prefixes_for_later_hits() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 11)))
    b = make_request("b", [*range(1, 9), 50, 51, 52])
    admit(manager, a)
    admit(manager, b)  # [0, 1, 3]
    manager.free(a)
    assert refs(manager)[:4] == [1, 1, 0, 1]
    assert free_list(manager) == [4, 5, 6, 7, 8, 9, 10, 2]
    manager.free(b)
    assert free_list(manager) == [4, 5, 6, 7, 8, 9, 10, 2, 3, 1, 0]
    assert manager.get_block_ids("b") == []
    # a later request with a's prefix pulls blocks 0 and 1 out of the free list
    d = make_request("d", [*range(1, 9), 7])
    assert admit(manager, d) == [0, 1, 4]
    assert free_list(manager) == [5, 6, 7, 8, 9, 10, 2, 3]
    assert refs(manager)[:5] == [1, 1, 0, 0, 1]


def test_eviction_takes_the_least_recently_freed_and_drops_its_prefix() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 13)))  # 3 full blocks, all cached
    admit(manager, a)
    manager.free(a)
    assert free_list(manager) == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1, 0]
    assert manager.stats().cached_blocks == 3
    big = make_request("big", list(range(100, 136)))  # 36 tokens: 9 blocks
    assert admit(manager, big) == [3, 4, 5, 6, 7, 8, 9, 10, 2]
    # block 2 (a's tail) was evicted; blocks 0 and 1 still hold a's prefix
    assert manager.stats().cached_blocks == 2 + 9
    again = make_request("again", list(range(1, 13)))
    hits, num_hit = manager.get_computed_blocks(again)
    assert [blk.block_id for blk in hits] == [0, 1] and num_hit == 8


def test_no_room_answers_none_and_changes_nothing() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 41)))  # 10 blocks
    admit(manager, a)
    b = make_request("b", list(range(200, 209)))  # needs 3 blocks, 1 is free
    assert manager.allocate_slots(b, 9) is None
    assert manager.get_block_ids("b") == []
    assert "b" not in manager.req_to_blocks
    assert refs(manager) == [1] * 10 + [0]


def test_free_cached_hit_blocks_do_not_count_as_room() -> None:
    manager = KVCacheManager(11, 4)
    a = make_request("a", list(range(1, 9)))
    admit(manager, a)  # [0, 1]
    manager.free(a)
    filler = make_request("filler", list(range(300, 336)))  # 9 blocks: 2..10
    assert admit(manager, filler) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    # free list is [1, 0], both cached; b hits block 0 and needs 2 more: only 1 is room
    b = make_request("b", [*range(1, 5), 60, 61, 62, 63, 64])
    hits, num_hit = manager.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0] and num_hit == 4
    assert manager.allocate_slots(b, 5, hits) is None
    assert refs(manager)[:2] == [0, 0]
    # one block less fits
    assert manager.allocate_slots(b, 4, hits) is not None
    assert manager.get_block_ids("b") == [0, 1]
    assert manager.stats().cached_blocks == 9 + 1  # block 1 lost a's second block


def test_caching_off_means_no_hits() -> None:
    manager = KVCacheManager(11, 4, enable_prefix_caching=False)
    a = make_request("a", list(range(1, 11)))
    admit(manager, a)
    b = make_request("b", list(range(1, 11)))
    assert manager.get_computed_blocks(b) == ([], 0)
    assert manager.stats().cached_blocks == 0


def test_everything_freed_returns_the_pool_to_idle() -> None:
    manager = KVCacheManager(11, 4)
    requests = [make_request(f"r{i}", [i + 1] * (i + 3)) for i in range(5)]
    for request in requests:
        admit(manager, request)
    for request in requests:
        manager.free(request)
    stats = manager.stats()
    assert (stats.used_blocks, stats.free_blocks) == (0, 11)
    assert refs(manager) == [0] * 11
    assert manager.req_to_blocks == {}
    assert manager.reset_prefix_cache() is True


def test_hashes_chain_the_whole_prefix() -> None:
    first = hash_block_tokens(None, [1, 2, 3, 4])
    assert hash_block_tokens(None, [1, 2, 3, 4]) == first
    assert hash_block_tokens(first, [5, 6, 7, 8]) != hash_block_tokens(None, [5, 6, 7, 8])
    assert len(first) == 16


def test_block_bytes() -> None:
    # demo generator: 4 layers, 2 KV heads, head dim 64, float32, 16-token blocks
    assert kv_block_bytes(16, 4, 2, 64, 4) == 2 * 4 * 2 * 16 * 64 * 4
