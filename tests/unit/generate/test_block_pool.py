"""The block pool on 11 blocks: exact ids, ref counts and free-list order."""

from __future__ import annotations

import pytest

from tensord.generate.core.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock


def refs(pool: BlockPool) -> list[int]:
    return [block.ref_cnt for block in pool.blocks]


def test_a_fresh_pool_has_every_block_free_in_id_order() -> None:
    pool = BlockPool(11)
    assert pool.free_block_queue.block_ids() == list(range(11))
    assert pool.get_num_free_blocks() == 11
    assert pool.usage == 0.0


def test_allocation_takes_from_the_head_and_answers_none_without_room() -> None:
    pool = BlockPool(11)
    first = pool.get_new_blocks(3)
    assert first is not None
    assert [b.block_id for b in first] == [0, 1, 2]
    assert refs(pool) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert pool.get_new_blocks(9) is None
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 7, 8, 9, 10]
    rest = pool.get_new_blocks(8)
    assert rest is not None
    assert pool.get_num_free_blocks() == 0
    assert pool.get_new_blocks(1) is None
    assert pool.get_new_blocks(0) == []
    assert pool.usage == 1.0


def test_freed_blocks_join_the_tail_in_the_order_given() -> None:
    pool = BlockPool(11)
    blocks = pool.get_new_blocks(4)
    assert blocks is not None
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_queue.block_ids() == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1, 0]
    assert refs(pool) == [0] * 11


def test_shared_blocks_return_only_when_the_last_reference_goes() -> None:
    pool = BlockPool(11)
    blocks = pool.get_new_blocks(2)
    assert blocks is not None
    pool.touch(blocks)
    assert refs(pool)[:2] == [2, 2]
    pool.free_blocks(reversed(blocks))
    assert refs(pool)[:2] == [1, 1]
    assert pool.get_num_free_blocks() == 9
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_queue.block_ids()[-2:] == [1, 0]
    with pytest.raises(ValueError, match="block 0 freed more often"):
        pool.free_blocks([blocks[0]])


def test_cached_blocks_stay_reusable_when_freed_until_evicted() -> None:
    pool = BlockPool(11)
    blocks = pool.get_new_blocks(3)
    assert blocks is not None
    pool.cache_full_blocks(blocks, [b"h0", b"h1"], 0)
    assert pool.get_num_cached_blocks() == 2
    pool.free_blocks(reversed(blocks))
    # free list: 3..10, then 2, 1, 0; blocks 0 and 1 keep their prefix
    assert pool.get_cached_block(b"h0") is blocks[0]
    # a prefix hit takes a cached block out of the middle of the free list
    pool.touch([blocks[0]])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]
    assert refs(pool)[:3] == [1, 0, 0]
    # allocating 10 reaches block 1 at the head, which loses its prefix
    taken = pool.get_new_blocks(10)
    assert taken is not None
    assert [b.block_id for b in taken] == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]
    assert pool.get_cached_block(b"h1") is None
    assert blocks[1].block_hash is None
    assert pool.get_cached_block(b"h0") is blocks[0]
    assert pool.get_num_cached_blocks() == 1


def test_a_duplicate_prefix_keeps_its_first_block() -> None:
    pool = BlockPool(11)
    a = pool.get_new_blocks(1)
    b = pool.get_new_blocks(1)
    assert a is not None and b is not None
    pool.cache_full_blocks(a, [b"same"], 0)
    pool.cache_full_blocks(b, [b"same"], 0)
    assert pool.get_cached_block(b"same") is a[0]
    assert b[0].block_hash is None
    pool.free_blocks(b)
    pool.free_blocks(a)
    taken = pool.get_new_blocks(11)
    assert taken is not None
    assert pool.get_num_cached_blocks() == 0


def test_caching_off_hashes_nothing() -> None:
    pool = BlockPool(11, enable_caching=False)
    blocks = pool.get_new_blocks(1)
    assert blocks is not None
    pool.cache_full_blocks(blocks, [b"h"], 0)
    assert pool.get_cached_block(b"h") is None


def test_reset_prefix_cache_only_when_idle() -> None:
    pool = BlockPool(11)
    blocks = pool.get_new_blocks(2)
    assert blocks is not None
    pool.cache_full_blocks(blocks, [b"a", b"b"], 0)
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert pool.get_num_cached_blocks() == 0
    assert all(block.block_hash is None for block in pool.blocks)


def test_free_queue_removal_and_errors() -> None:
    blocks = [KVCacheBlock(i) for i in range(3)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[1])
    assert queue.block_ids() == [0, 2]
    assert queue.num_free_blocks == 2
    with pytest.raises(ValueError, match="block 1 is not in the free list"):
        queue.remove(blocks[1])
    queue.append(blocks[1])
    assert [queue.popleft().block_id for _ in range(3)] == [0, 2, 1]
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()


def test_a_pool_needs_a_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)
