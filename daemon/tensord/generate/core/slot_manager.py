"""KV slots: one per running sequence, packed low, for graphs with fused attention.

A slot is a row of per-layer KV buffers that a sequence owns from its first prompt token
to its finish (the bytes live in worker/kv_slots.py; this module only decides who holds
which row). The scheduler sees the same facade as the paged KVCacheManager: a request's
"block table" is its one slot id, `allocate_slots` finds it room or answers None when
every slot is taken (the request waits; a running one never needs more), `free` gives the
slot back.

Held slots are kept packed in rows 0..n-1, so decode passes over the first n rows carry
no free row. A sequence that leaves may leave a hole below the top; `take_moves`, called
once between steps, moves the top sequences into the holes (as few moves as there are
holes under the top, none for a sequence that left in the same step) and hands those
moves to the runner, which copies the bytes before its next pass. A new sequence takes
the lowest free slot. A decode step itself never moves the cache.

With a prefix index (slot_prefix.py), a joining request's stored prefix is copied into its
slot and its computed blocks are copied into the host store: the scheduler sees them as
the paged manager's prefix hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensord.generate.core.block_pool import KVCacheBlock
from tensord.generate.core.kv_cache_manager import KVCacheStats
from tensord.generate.core.request import Request
from tensord.generate.core.slot_prefix import SlotPrefixIndex


@dataclass(slots=True, frozen=True)
class SlotMove:
    """Copy slot `source`'s bytes into slot `target` (the sequence moved down)."""

    source: int
    target: int


class SlotManager:
    """Hands each running request one slot of `num_slots`, each `slot_tokens` long."""

    def __init__(
        self, num_slots: int, slot_tokens: int, prefix: SlotPrefixIndex | None = None
    ) -> None:
        """`prefix`: the host prefix store's index, None when prefixes are not reused."""
        if num_slots < 1 or slot_tokens < 1:
            raise ValueError(f"need >= 1 slot of >= 1 token, got {num_slots} x {slot_tokens}")
        self.num_slots = num_slots
        self.slot_tokens = slot_tokens
        self.prefix = prefix
        self._slot_of: dict[str, int] = {}
        self._holder: list[str | None] = [None] * num_slots
        self.moves_made = 0
        """Sequences moved down into a hole since start (Info)."""

    @property
    def max_tokens(self) -> int:
        """The most tokens one sequence may hold: one slot's length."""
        return self.slot_tokens

    @property
    def num_used(self) -> int:
        """Slots held now: they are rows 0..num_used-1."""
        return len(self._slot_of)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The request's prefix the store holds (none without a prefix index)."""
        if self.prefix is None:
            return [], 0
        return self.prefix.lookup(request)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Room for the request's next tokens: its slot, or the lowest free one; None
        when every slot is held (or the tokens would overrun the slot). A new request's
        `new_computed_blocks` (get_computed_blocks') are copied into its slot before its
        first pass."""
        hit = len(new_computed_blocks) * (self.prefix.block_size if self.prefix else 0)
        if request.num_computed_tokens + hit + num_new_tokens > self.slot_tokens:
            return None
        if request.request_id in self._slot_of:
            return []
        if self.num_used == self.num_slots:
            return None
        slot = self._holder.index(None)  # the lowest free row
        self._slot_of[request.request_id] = slot
        self._holder[slot] = request.request_id
        if self.prefix is not None:
            self.prefix.admitted(request, slot, new_computed_blocks)
        return []

    def cache_blocks(self, request: Request) -> None:
        """After a step: the request's newly full blocks are owed to the prefix store."""
        slot = self._slot_of.get(request.request_id)
        if self.prefix is not None and slot is not None:
            self.prefix.computed(request, slot)

    def free(self, request: Request) -> None:
        """Give the request's slot back (take_moves closes the hole)."""
        slot = self._slot_of.pop(request.request_id, None)
        if slot is not None:
            self._holder[slot] = None
        if self.prefix is not None:
            self.prefix.forget(request)

    def take_moves(self) -> list[SlotMove]:
        """Pack the held slots into rows 0..n-1: the highest held slot moves into the
        lowest hole until none is left; the moves, in order, for the runner to apply."""
        moves = []
        holes = [s for s in range(self.num_used) if self._holder[s] is None]
        tops = [s for s in range(self.num_slots - 1, self.num_used - 1, -1) if self._holder[s]]
        for hole, top in zip(holes, tops, strict=True):
            mover = self._holder[top]
            assert mover is not None
            self._holder[top], self._holder[hole] = None, mover
            self._slot_of[mover] = hole
            moves.append(SlotMove(top, hole))
        self.moves_made += len(moves)
        return moves

    def has_room(self, num_tokens: int) -> bool:
        """Whether a slot is free (and holds that many tokens)."""
        return self.num_used < self.num_slots and num_tokens <= self.slot_tokens

    def get_block_ids(self, request_id: str) -> list[int]:
        """[the request's slot], or [] when it holds none."""
        slot = self._slot_of.get(request_id)
        return [] if slot is None else [slot]

    def stats(self) -> KVCacheStats:
        """Slots as blocks of slot_tokens tokens (what Info's kv_cache reports)."""
        used = self.num_used
        return KVCacheStats(
            total_blocks=self.num_slots,
            used_blocks=used,
            free_blocks=self.num_slots - used,
            cached_blocks=0,
            block_size=self.slot_tokens,
            prefix_queries=self.prefix.query_tokens if self.prefix else 0,
            prefix_hits=self.prefix.hit_tokens if self.prefix else 0,
        )

    def prefix_stats(self) -> KVCacheStats | None:
        """The host prefix store's blocks (None without one)."""
        if self.prefix is None:
            return None
        pool = self.prefix.pool
        free = pool.get_num_free_blocks()
        return KVCacheStats(
            total_blocks=pool.num_blocks,
            used_blocks=pool.num_blocks - free,
            free_blocks=free,
            cached_blocks=pool.get_num_cached_blocks(),
            block_size=self.prefix.block_size,
            prefix_queries=self.prefix.query_tokens,
            prefix_hits=self.prefix.hit_tokens,
        )
