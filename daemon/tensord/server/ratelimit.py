"""Token buckets: a steady rate with room for bursts, one bucket per caller."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Rate:
    """`per_second` requests a second on average, up to `burst` at once; 0 per second: none."""

    per_second: float
    burst: int

    @classmethod
    def of(cls, per_second: float, burst: int = 0) -> Rate:
        """A rate whose burst defaults to the rate rounded up (at least 1)."""
        return cls(per_second, burst or max(1, math.ceil(per_second)))

    @property
    def limited(self) -> bool:
        """False for the unlimited rate."""
        return self.per_second > 0


class TokenBucket:
    """Holds up to `burst` permits, refilled at `per_second`; each request takes one."""

    __slots__ = ("_level", "_updated", "rate")

    def __init__(self, rate: Rate, now: float | None = None) -> None:
        self.rate = rate
        self._level = float(rate.burst)
        self._updated = time.monotonic() if now is None else now

    def take(self, now: float | None = None) -> float:
        """Take a permit: 0.0 when granted, else the seconds until one is there."""
        now = time.monotonic() if now is None else now
        rate = self.rate
        self._level = min(float(rate.burst), self._level + (now - self._updated) * rate.per_second)
        self._updated = now
        if self._level >= 1.0:
            self._level -= 1.0
            return 0.0
        return (1.0 - self._level) / rate.per_second

    def retune(self, rate: Rate) -> None:
        """Apply a new rate, keeping what is in the bucket (capped at the new burst)."""
        self.rate = rate
        self._level = min(self._level, float(rate.burst))
