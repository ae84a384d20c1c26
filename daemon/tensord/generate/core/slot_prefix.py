"""Prefix reuse on KV slots: which prompt prefixes the host prefix store holds.

Slots are private to their sequences, so a prefix is shared by copying: once a step has
computed a full block of a sequence's tokens, that block's keys and values are copied from
the slot into a block of the host store (worker/prefix_store.py) under the block's chained
hash (kv_cache_manager.hash_block_tokens: equal hashes, equal whole prefixes), unless the
store holds that hash already. A request that joins looks its prompt up block by block; the
blocks found are copied into its new slot before its first pass, and only the rest of its
prompt is computed (always at least its last token, whose pass yields the next token's
logits).

This module only decides: it keeps the store's block pool (ref counts, hashes, the
least-recently-used free list of block_pool.py) and the copies each step owes; the engine
has the bytes copied between steps (kv_paths.py): a step's saves after it ran, before any
slot changes hands, and the next step's loads after slot moves, before its passes. A block
being loaded, or being saved, holds a reference until its copy is done, so nothing evicts
it meanwhile; a saved block is found under its hash only once its bytes are in. Blocks go
back to the free list last block first, so a prefix's first block is the last evicted (the
others are unreachable without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensord.generate.core.block_pool import BlockPool, KVCacheBlock
from tensord.generate.core.kv_cache_manager import update_block_hashes
from tensord.generate.core.request import Request


@dataclass(slots=True, frozen=True)
class PrefixCopy:
    """Blocks of one slot and the store: the slot's positions first_block * block_size
    onwards, block i of them in store block store_blocks[i]."""

    slot: int
    first_block: int
    store_blocks: tuple[int, ...]


@dataclass(slots=True)
class PrefixLoad:
    """A copy from the store into a slot, and the store blocks it holds until done."""

    copy: PrefixCopy
    blocks: list[KVCacheBlock]


class SlotPrefixIndex:
    """The host prefix store's blocks: lookups, and the copies each step owes."""

    def __init__(self, num_blocks: int, block_size: int, held_tokens: int | None) -> None:
        """`held_tokens`: how long a sequence's slot holds its positions as they are (a
        layer whose cache is a window-sized ring overwrites them past that): no block is
        stored from a sequence longer than that and no request takes a longer prefix. None:
        the whole slot."""
        self.pool = BlockPool(num_blocks, enable_caching=True)
        self.block_size = block_size
        self._held_tokens = held_tokens
        self._max_hit_blocks = None if held_tokens is None else held_tokens // block_size
        self._entered: dict[str, int] = {}
        """Per running request: its leading blocks the store holds (found or saved)."""
        self._saves: list[PrefixCopy] = []
        self._saving: list[tuple[KVCacheBlock, bytes]] = []
        """The store blocks the owed saves fill (referenced), and their hashes."""
        self._loads: list[PrefixLoad] = []
        self.query_tokens = 0
        """Prompt tokens of admitted requests looked up."""
        self.hit_tokens = 0
        """Of those, tokens copied from the store rather than computed."""

    def lookup(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest stored prefix of a request about to join (not yet referenced), and
        the tokens it holds."""
        hashes = update_block_hashes(request, self.block_size)
        most = (request.num_tokens - 1) // self.block_size
        if self._max_hit_blocks is not None:
            most = min(most, self._max_hit_blocks)
        blocks = self.pool.cached_prefix(hashes[:most])
        return blocks, len(blocks) * self.block_size

    def admitted(self, request: Request, slot: int, hits: Sequence[KVCacheBlock]) -> None:
        """The request took `slot` with `hits` (from lookup): a load is owed."""
        self.query_tokens += request.num_tokens
        self.hit_tokens += len(hits) * self.block_size
        self._entered[request.request_id] = len(hits)
        if hits:
            self.pool.touch(hits)
            ids = tuple(block.block_id for block in hits)
            self._loads.append(PrefixLoad(PrefixCopy(slot, 0, ids), list(hits)))

    def computed(self, request: Request, slot: int) -> None:
        """After a step: the request's full blocks of computed tokens that the store does not
        hold yet are owed to it (the least recently used stored blocks make room)."""
        entered = self._entered.get(request.request_id)
        if entered is None:
            return
        full = request.num_computed_tokens // self.block_size
        if self._held_tokens is not None and request.num_computed_tokens > self._held_tokens:
            # A ring has overwritten positions this step may have completed: none is saved.
            self._entered[request.request_id] = max(entered, full)
            return
        if full <= entered:
            return
        hashes = update_block_hashes(request, self.block_size)
        self._entered[request.request_id] = self._owe(slot, hashes, entered, full)

    def _owe(self, slot: int, hashes: list[bytes], entered: int, full: int) -> int:
        """Owe the store blocks entered..full-1 that it lacks, as runs of consecutive
        positions; returns how far the request's prefix is entered now."""
        run: list[int] = []
        first = entered
        chain = set(hashes[:entered])
        for index in range(entered, full):
            if self.pool.get_cached_block(hashes[index]) is not None:
                if run:
                    self._saves.append(PrefixCopy(slot, first, tuple(run)))
                    run = []
            else:
                evicted = self.pool.next_evicted()
                if evicted is not None and evicted.block_hash in chain:
                    # Room only by evicting a block before it in this very prefix: this
                    # one could never be found. The sequence stores nothing more.
                    entered = full
                    break
                new = self.pool.get_new_blocks(1)
                if new is None:  # every block is being copied: try again after the step
                    break
                self._saving.append((new[0], hashes[index]))
                first = first if run else index
                run.append(new[0].block_id)
            chain.add(hashes[index])
            entered = index + 1
        if run:
            self._saves.append(PrefixCopy(slot, first, tuple(run)))
        return entered

    def forget(self, request: Request) -> None:
        """The request left its slot."""
        self._entered.pop(request.request_id, None)

    def take_saves(self) -> tuple[list[PrefixCopy], list[tuple[KVCacheBlock, bytes]]]:
        """The copies into the store owed since the last call, and the blocks they fill
        with their hashes (pass them to `saved` once copied)."""
        saves, saving = self._saves, self._saving
        self._saves, self._saving = [], []
        return saves, saving

    def saved(self, saving: Sequence[tuple[KVCacheBlock, bytes]], done: bool) -> None:
        """Those copies are done (`done`: their blocks are found under their hashes from
        now on) or did not happen (the blocks are free, unhashed); either way the blocks
        go back to the free list, last first."""
        if done:
            for block, block_hash in saving:
                self.pool.cache_full_blocks([block], [block_hash], 0)  # first copy wins
        self.pool.free_blocks(block for block, _ in reversed(saving))

    def take_loads(self) -> list[PrefixLoad]:
        """The copies into slots owed since the last call."""
        loads, self._loads = self._loads, []
        return loads

    def loaded(self, loads: Sequence[PrefixLoad]) -> None:
        """Those copies are done (or failed): their store blocks are free to evict again,
        as the most recently used."""
        for load in loads:
            self.pool.free_blocks(reversed(load.blocks))
