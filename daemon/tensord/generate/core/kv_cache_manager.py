"""The KV cache manager: block tables per request over the block pool, with prefix reuse.

The scheduler talks only to this facade: it asks for the cached prefix of a request,
for slots for the tokens it is about to compute, and frees a request's blocks when it
finishes or is preempted. Blocks are allocated on demand for exactly the tokens scheduled,
so a sequence never holds more than one partly filled block (wasted KV memory stays
under one block per sequence).

Prefix reuse: a block full of computed tokens is entered into the prefix cache under a
chained hash, the hash of its parent block's hash and its own token ids, so equal hashes
mean equal whole prefixes. Prompt blocks and generated blocks alike are entered once
their keys and values are written (`cache_blocks`, after the step that computed them);
a partly filled block is never shared. A lookup always leaves at least the last token to
compute, since the step that computes it yields the logits for the next one.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from tensord.generate.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from tensord.generate.core.request import Request

_ROOT_HASH = b"tensord-kv-root"


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The chained hash of one full block: its parent's hash and its own token ids."""
    digest = hashlib.blake2b(parent or _ROOT_HASH, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def kv_block_bytes(
    block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
) -> int:
    """Bytes one block takes across all layers, keys and values both."""
    return 2 * num_layers * num_kv_heads * block_size * head_dim * dtype_bytes


@dataclass(slots=True, frozen=True)
class KVCacheStats:
    """Pool occupancy for Info and metrics."""

    total_blocks: int
    used_blocks: int
    """Blocks some running sequence holds."""
    free_blocks: int
    """Blocks ready to allocate, cached ones included."""
    cached_blocks: int
    """Blocks holding a reusable prefix, in use or free."""
    block_size: int
    prefix_queries: int
    """Tokens of admitted requests looked up in the prefix cache so far."""
    prefix_hits: int
    """Of those, tokens found cached (not computed again)."""

    @property
    def utilisation(self) -> float:
        """used / total, 0 to 1."""
        return self.used_blocks / self.total_blocks


class KVCacheManager:
    """Hands the scheduler opaque block lists; owns each request's block table."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self._prefix_queries = 0
        self._prefix_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def max_tokens(self) -> int:
        """The most tokens the whole pool holds; no sequence can be longer."""
        return self.block_pool.num_blocks * self.block_size

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a request that has nothing computed yet.

        Returns the blocks (not yet referenced: pass them to `allocate_slots`) and the
        number of tokens they hold.
        """
        if not self.enable_prefix_caching:
            return [], 0
        hashes = self._update_block_hashes(request)
        # Leave at least one token to compute: its step yields the next token's logits.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        blocks = self.block_pool.cached_prefix(hashes[:max_hit_blocks])
        return blocks, len(blocks) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens after the computed ones.

        `new_computed_blocks` (from `get_computed_blocks`) join the request's table first.
        Returns the newly allocated blocks, or None, changing nothing, when the pool has
        too few free blocks.
        """
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks and not new_computed_blocks:  # a decode step within its last block
            needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)
            if needed <= len(blocks):
                return []
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = max(0, num_required - len(blocks) - len(new_computed_blocks))
        # Hit blocks that sit in the free list leave it when touched: they are not room.
        num_evictable_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > self.block_pool.get_num_free_blocks() - num_evictable_hits:
            if not blocks:
                del self.req_to_blocks[request.request_id]
            return None
        if not blocks:  # the request's first slots: count its prefix lookup
            self._prefix_queries += request.num_tokens
            self._prefix_hits += len(new_computed_blocks) * self.block_size
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self._num_cached_blocks[request.request_id] = len(blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        assert new_blocks is not None
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request) -> None:
        """Enter the request's full, computed blocks into the prefix cache.

        Call after the step that wrote their keys and values, with
        `request.num_computed_tokens` already counting that step's tokens.
        """
        if not self.enable_prefix_caching:
            return
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        start = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self._update_block_hashes(request)
        self.block_pool.cache_full_blocks(blocks, hashes[:num_full], start)
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return a request's blocks to the pool, tail-first; cached ones stay reusable."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def has_room(self, num_tokens: int) -> bool:
        """Whether free blocks hold `num_tokens` more tokens of a new sequence."""
        return -(-num_tokens // self.block_size) <= self.block_pool.get_num_free_blocks()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table, a fresh list of block ids."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    def get_num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    def stats(self) -> KVCacheStats:
        free = self.block_pool.get_num_free_blocks()
        return KVCacheStats(
            total_blocks=self.num_blocks,
            used_blocks=self.num_blocks - free,
            free_blocks=free,
            cached_blocks=self.block_pool.get_num_cached_blocks(),
            block_size=self.block_size,
            prefix_queries=self._prefix_queries,
            prefix_hits=self._prefix_hits,
        )

    def reset_prefix_cache(self) -> bool:
        """Forget cached prefixes (refused while any block is in use)."""
        return self.block_pool.reset_prefix_cache()

    def _update_block_hashes(self, request: Request) -> list[BlockHash]:
        return update_block_hashes(request, self.block_size)


def update_block_hashes(request: Request, block_size: int) -> list[BlockHash]:
    """Extend the request's chained hashes to cover all its full blocks of tokens."""
    hashes = request.block_hashes
    tokens = request.all_token_ids
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(parent, tokens[start : start + block_size]))
    return hashes
