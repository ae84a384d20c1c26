"""The cyclic garbage collector, set for a server whose long-lived heap is made at start-up.

Two costs of CPython's default collector, measured on the 2-core benchmark host with the
daemon serving the demo repository at 64 Predict calls in flight:

* The heap after start-up holds about 75,000 objects that live as long as the process
  (ONNX Runtime, protobuf, NumPy and their modules, the config, the models' metadata).
  Every full collection walks all of them: 32-35 ms with the event loop stopped, about
  every 1.5 s under load (grpc.aio leaves a reference cycle of five objects behind every
  call, so collections keep coming). Every call in flight waits those milliseconds.
  Frozen after loading (`gc.freeze`: the permanent generation, which collections skip),
  a full collection takes under 1 ms.
* With the default first-generation threshold (700), the youngest generation is collected
  about 85 times a second, and each pass walks the calls in flight as well as the garbage:
  about 18 ms of collector time per second. At 10,000 it runs about 1.5 times a second at
  about 3 ms a pass.

Freezing is redone after each reload: first unfrozen, so that the cycles the replaced
versions leave behind are collected rather than kept for good.
"""

from __future__ import annotations

import gc
import time

YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) of tracked objects between first-generation passes."""


def tune() -> None:
    """Raise the first generation's threshold (the older ones keep their defaults)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def settle() -> tuple[float, int]:
    """Collect everything, then freeze what survives. Returns the seconds it took and the
    number of objects frozen. Call it when the heap has just changed shape (start-up, a
    reload): the collection stops the caller, event loop included, for its duration."""
    start = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - start, gc.get_freeze_count()
