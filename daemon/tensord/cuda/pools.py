"""Buffer pools in power-of-two size classes, with reuse and high-water stats.

One mechanism serves host memory (aligned NumPy buffers), pinned host memory
(cudaHostAlloc) and device memory (cudaMalloc): a batch takes buffers from a pool instead
of allocating, so the allocator stays off the hot path, and so does freeing: cudaFree and
cudaFreeHost synchronise the whole device, so a released buffer is always kept, and
`trim()` frees what is cached beyond the cap when the executor is idle. An allocation that
runs out of memory frees every cached buffer and tries once more before it fails.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from tensord.errors import OutOfMemoryError

ALIGNMENT = 64
MIN_CLASS = 4096

B = TypeVar("B")


def size_class(nbytes: int) -> int:
    """The smallest power of two >= nbytes, at least MIN_CLASS."""
    return max(MIN_CLASS, 1 << max(nbytes - 1, 0).bit_length())


@dataclass(slots=True)
class PoolStats:
    """A buffer pool: bytes handed out now, bytes cached for reuse, the high-water mark."""

    in_use_bytes: int = 0
    cached_bytes: int = 0
    high_water_bytes: int = 0
    allocations: int = 0
    reuses: int = 0


class SizeClassPool(Generic[B]):
    """Buffers of `alloc(size)`, kept by size class for reuse up to a byte cap."""

    def __init__(
        self,
        alloc: Callable[[int], B],
        free: Callable[[B], None],
        size_of: Callable[[B], int],
        max_cached_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self._alloc, self._free_fn, self._size_of = alloc, free, size_of
        self._free: dict[int, list[B]] = defaultdict(list)
        self._lock = threading.Lock()
        self._max_cached = max_cached_bytes
        self._stats = PoolStats()

    def acquire(self, nbytes: int) -> B:
        """A buffer of at least `nbytes` bytes (its size is the size class)."""
        cls = size_class(nbytes)
        with self._lock:
            free = self._free[cls]
            buffer = free.pop() if free else None
            if buffer is not None:
                self._stats.cached_bytes -= cls
                self._stats.reuses += 1
        if buffer is None:
            buffer = self._allocate(cls)  # outside the lock: it may be slow or raise
            with self._lock:
                self._stats.allocations += 1
        with self._lock:
            self._stats.in_use_bytes += cls
            self._stats.high_water_bytes = max(
                self._stats.high_water_bytes, self._stats.in_use_bytes
            )
        return buffer

    def _allocate(self, cls: int) -> B:
        try:
            return self._alloc(cls)
        except OutOfMemoryError:
            # Buffers of other size classes may hold the memory this one needs.
            if not self.clear():
                raise
            return self._alloc(cls)

    def release(self, buffer: B) -> None:
        """Give a buffer back. It is kept even beyond the cache cap (freeing would stall
        the device on the hot path); trim() frees the excess later."""
        cls = self._size_of(buffer)
        with self._lock:
            self._stats.in_use_bytes -= cls
            self._free[cls].append(buffer)
            self._stats.cached_bytes += cls

    def trim(self) -> int:
        """Free cached buffers, largest first, until the cache is within its cap (call it
        when no batch runs); the bytes freed."""
        victims = []
        with self._lock:
            for cls in sorted(self._free, reverse=True):
                buffers = self._free[cls]
                while buffers and self._stats.cached_bytes > self._max_cached:
                    victims.append(buffers.pop())
                    self._stats.cached_bytes -= cls
        for buffer in victims:
            self._free_fn(buffer)
        return sum(self._size_of(b) for b in victims)

    def stats(self) -> PoolStats:
        """A copy of the counters."""
        with self._lock:
            s = self._stats
            return PoolStats(
                s.in_use_bytes, s.cached_bytes, s.high_water_bytes, s.allocations, s.reuses
            )

    def clear(self) -> int:
        """Free every cached buffer (buffers in use stay theirs); the bytes freed."""
        with self._lock:
            cached = [b for buffers in self._free.values() for b in buffers]
            self._free.clear()
            self._stats.cached_bytes = 0
        for buffer in cached:
            self._free_fn(buffer)
        return sum(self._size_of(b) for b in cached)


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes]


class HostBufferPool(SizeClassPool[np.ndarray]):
    """64-byte aligned uint8 NumPy buffers (ordinary pageable memory)."""

    def __init__(self, max_cached_bytes: int = 256 * 1024 * 1024) -> None:
        super().__init__(_aligned, lambda _: None, lambda b: b.nbytes, max_cached_bytes)
