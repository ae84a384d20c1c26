"""The block pool: every KV cache block, its ref count, its prefix hash, and the free list.

A block holds the keys and values of `block_size` consecutive token positions of one
sequence, in every layer (the tensors themselves live with the model runner; the pool
only hands out ids). Block ids run 0..num_blocks-1 and every one is usable: none is
reserved, so an unused block-table slot is written -1, never a block id.

The free list is kept in eviction order (least recently freed first). A freed block whose
tokens were hashed keeps its hash and stays in the prefix cache until allocation reaches
it at the head of the free list and evicts it; a prefix hit meanwhile takes it back out.
Callers free a sequence's blocks tail-first, so its last blocks, the least likely to be
shared, are evicted before its first ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BlockHash = bytes


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One block: its id, how many sequences use it, its prefix hash, its free-list links."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    """Set while the block is in the prefix cache (full, computed tokens)."""
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        hashed = self.block_hash is not None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hashed={hashed})"


class FreeKVCacheBlockQueue:
    """A doubly linked list of free blocks: O(1) pop from the head, append, and removal.

    Removal from the middle is what a prefix hit on a freed, cached block needs.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Take the block at the head (the least recently freed)."""
        block = self._head.next_free_block
        if block is None or block is self._tail:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def peek(self) -> KVCacheBlock:
        """The block at the head, left in place."""
        block = self._head.next_free_block
        if block is None or block is self._tail:
            raise ValueError("no free blocks")
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free list")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (the last to be evicted)."""
        last = self._tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """The free list, head first (for stats and tests)."""
        ids = []
        block = self._head.next_free_block
        while block is not None and block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free_block
        return ids


class BlockPool:
    """Owns every block; allocation answers None when there is no room."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}

    def get_num_free_blocks(self) -> int:
        """Blocks no sequence uses, cached ones included (they can be evicted)."""
        return self.free_block_queue.num_free_blocks

    def get_num_cached_blocks(self) -> int:
        """Blocks holding a reusable prefix, whether in use or free."""
        return len(self.cached_block_hash_to_block)

    @property
    def usage(self) -> float:
        """The share of blocks in use by some sequence, 0 to 1."""
        return 1.0 - self.get_num_free_blocks() / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[KVCacheBlock]:
        """The cached blocks of the longest run of `block_hashes` from the first (not
        referenced: the caller takes them)."""
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes:
            block = self.cached_block_hash_to_block.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock] | None:
        """Take `num_blocks` from the head of the free list, evicting cached prefixes."""
        if num_blocks > self.get_num_free_blocks():
            return None
        blocks = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones off the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(
        self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash], start: int
    ) -> None:
        """Enter blocks[start:len(block_hashes)] into the prefix cache under their hashes.

        A hash already cached (another sequence computed the same prefix at the same time)
        keeps its first block; this copy stays private and is freed uncached.
        """
        if not self.enable_caching:
            return
        for i in range(start, len(block_hashes)):
            block, block_hash = blocks[i], block_hashes[i]
            if block.block_hash is not None or block_hash in self.cached_block_hash_to_block:
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; those that reach 0 join the free list's tail
        in the order given (callers pass a sequence's blocks tail-first)."""
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def next_evicted(self) -> KVCacheBlock | None:
        """The block the next allocation takes (the free list's head), None if none."""
        queue = self.free_block_queue
        return None if queue.num_free_blocks == 0 else queue.peek()

    def uncache(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take blocks out of the prefix cache (their bytes were never written)."""
        for block in blocks:
            self._evict(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any block is in use."""
        if self.get_num_free_blocks() != self.num_blocks:
            return False
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
