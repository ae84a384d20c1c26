"""Reusable, 64-byte aligned host buffers in power-of-two size classes.

Joining a batch copies the requests' rows into one buffer; taking it from a pool instead of
allocating per batch keeps the allocator (and page faults) off the hot path.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np

from tensord.executor.base import PoolStats

ALIGNMENT = 64
MIN_CLASS = 4096


def size_class(nbytes: int) -> int:
    """The smallest power of two >= nbytes, at least MIN_CLASS."""
    return max(MIN_CLASS, 1 << max(nbytes - 1, 0).bit_length())


class HostBufferPool:
    """Hands out aligned uint8 buffers; released ones are kept for reuse up to a byte cap."""

    def __init__(self, max_cached_bytes: int = 256 * 1024 * 1024) -> None:
        self._free: dict[int, list[np.ndarray]] = defaultdict(list)
        self._lock = threading.Lock()
        self._max_cached = max_cached_bytes
        self.stats_ = PoolStats()

    def acquire(self, nbytes: int) -> np.ndarray:
        """An aligned buffer of at least `nbytes` bytes (its size is the size class)."""
        cls = size_class(nbytes)
        with self._lock:
            free = self._free[cls]
            if free:
                buffer = free.pop()
                self.stats_.cached_bytes -= cls
                self.stats_.reuses += 1
            else:
                buffer = _aligned(cls)
                self.stats_.allocations += 1
            self.stats_.in_use_bytes += cls
            self.stats_.high_water_bytes = max(
                self.stats_.high_water_bytes, self.stats_.in_use_bytes
            )
        return buffer

    def release(self, buffer: np.ndarray) -> None:
        """Give a buffer back; beyond the cache cap it is freed."""
        cls = buffer.nbytes
        with self._lock:
            self.stats_.in_use_bytes -= cls
            if self.stats_.cached_bytes + cls <= self._max_cached:
                self._free[cls].append(buffer)
                self.stats_.cached_bytes += cls

    def stats(self) -> PoolStats:
        """A copy of the counters."""
        with self._lock:
            s = self.stats_
            return PoolStats(
                s.in_use_bytes, s.cached_bytes, s.high_water_bytes, s.allocations, s.reuses
            )

    def clear(self) -> None:
        """Free every cached buffer."""
        with self._lock:
            self._free.clear()
            self.stats_.cached_bytes = 0


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes]
