"""The batcher's token budget: requests of different lengths join, packed by length around
the oldest, within rows and rows x longest, padded with each input's pad value."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from tensord.batching.batcher import BatchingSettings, DynamicBatcher, pad_to
from tensord.errors import ResourceExhaustedError
from tensord.executor.base import RunResult


class Pooler:
    """Sums each row's ids where its mask is 1 (what padding must not change), and records
    each batch's lengths and padded shape; can hold runs until released."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[int], tuple[int, ...]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, parts: list[dict[str, np.ndarray]], names: Sequence[str]) -> RunResult:
        ids = np.concatenate([p["ids"] for p in parts])
        mask = np.concatenate([p["mask"] for p in parts])
        lengths = [int(m.sum()) for m in mask]
        self.batches.append((lengths, ids.shape))
        await self.gate.wait()
        assert (ids[mask == 0] == 7).all()  # padded with the pad value
        return RunResult([(ids * mask).sum(axis=1, keepdims=True)], 0.0, 0.0)


def text(length: int) -> dict[str, np.ndarray]:
    return {
        "ids": np.arange(1, length + 1, dtype=np.int64).reshape(1, length),
        "mask": np.ones((1, length), np.int64),
    }


def batcher(pooler: Pooler, **settings: object) -> DynamicBatcher:
    defaults: dict[str, object] = {"max_batch_size": 64, "max_batch_tokens": 64}
    defaults.update(settings)
    return DynamicBatcher(
        "m",
        BatchingSettings(pad_values=(("ids", 7),), **defaults),
        pooler,  # type: ignore[arg-type]
    )


async def test_lengths_join_padded_and_each_gets_its_own_answer() -> None:
    pooler = Pooler()
    pooler.gate.clear()
    b = batcher(pooler)
    first = asyncio.create_task(b.submit(text(2), ["s"], None))
    await asyncio.sleep(0.01)  # the first run holds the only instance meanwhile
    lengths = [3, 9, 4, 5]
    runs = [asyncio.create_task(b.submit(text(n), ["s"], None)) for n in lengths]
    await asyncio.sleep(0.01)
    pooler.gate.set()
    results = await asyncio.gather(first, *runs)
    sums = [int(r.outputs[0][0, 0]) for r in results]
    assert sums == [n * (n + 1) // 2 for n in [2, *lengths]]
    lengths_run, shape = pooler.batches[1]
    assert (sorted(lengths_run), shape) == ([3, 4, 5, 9], (4, 9))
    await b.close()


async def test_packing_keeps_to_the_budget_and_starts_from_the_oldest() -> None:
    pooler = Pooler()
    pooler.gate.clear()
    b = batcher(pooler, max_batch_tokens=40)
    first = asyncio.create_task(b.submit(text(1), ["s"], None))
    await asyncio.sleep(0.01)
    lengths = [10, 30, 9, 11, 29, 12]
    runs = [asyncio.create_task(b.submit(text(n), ["s"], None)) for n in lengths]
    await asyncio.sleep(0.01)
    pooler.gate.set()
    await asyncio.gather(first, *runs)
    formed = [sorted(lengths) for lengths, _ in pooler.batches[1:]]
    # The oldest (10) with the lengths closest to it while rows x longest <= 40 (10, 9, 11
    # pad to 11: 33 tokens); then 30 with 29 (60 > 40: alone), and so on.
    assert formed[0] == [9, 10, 11]
    for _, shape in pooler.batches[1:]:
        assert shape[0] * shape[1] <= 40
    assert sorted(n for f in formed for n in f) == sorted(lengths)
    await b.close()


async def test_a_request_over_the_budget_is_refused() -> None:
    b = batcher(Pooler(), max_batch_tokens=16)
    with pytest.raises(ResourceExhaustedError, match="max_batch_tokens 16"):
        await b.submit(text(17), ["s"], None)
    await b.close()


def test_pad_to_leaves_the_longest_part_alone() -> None:
    parts = [text(3), text(5)]
    padded = pad_to(parts, {"ids": 7})
    assert padded[1] is parts[1]
    assert padded[0]["ids"].tolist() == [[1, 2, 3, 7, 7]]
    assert padded[0]["mask"].tolist() == [[1, 1, 1, 0, 0]]


async def test_a_call_queues_all_its_texts_or_none() -> None:
    from tensord.errors import InvalidArgumentError

    pooler = Pooler()
    pooler.gate.clear()
    b = batcher(pooler, max_queue_size=4)
    with pytest.raises(InvalidArgumentError, match="more than model 'm'"):
        b.check_room(5)
    first = asyncio.create_task(b.submit(text(2), ["s"], None))
    await asyncio.sleep(0.01)  # running, not queued
    queued = [asyncio.create_task(b.submit(text(3), ["s"], None)) for _ in range(3)]
    await asyncio.sleep(0.01)
    with pytest.raises(ResourceExhaustedError, match="no room for 2 more"):
        b.check_room(2)
    b.check_room(1)
    pooler.gate.set()
    await asyncio.gather(first, *queued)
    await b.close()
