"""tensord.heap: the collector's first-generation threshold and the frozen heap."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tensord import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()  # the test process's heap goes back to being collected


@pytest.mark.usefixtures("restored_collector")
def test_tune_raises_only_the_first_generation() -> None:
    gc.set_threshold(700, 10, 10)
    heap.tune()
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.mark.usefixtures("restored_collector")
def test_settle_collects_cycles_then_freezes_the_survivors() -> None:
    kept, garbage = _Node(), _Node()
    kept_ref, garbage_ref = weakref.ref(kept), weakref.ref(garbage)
    del garbage
    seconds, frozen = heap.settle()
    assert garbage_ref() is None  # collected before the freeze
    assert seconds >= 0 and frozen == gc.get_freeze_count() > 0
    # Frozen: in no generation, so no collection walks it.
    assert not any(o is kept for o in gc.get_objects())
    # Settling again unfreezes first: a cycle that died since is collected, not kept.
    del kept
    heap.settle()
    assert kept_ref() is None
