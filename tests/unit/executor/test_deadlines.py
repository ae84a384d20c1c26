"""The deadline queue's entries: the in-queue check, the timer, and the hooks' order."""

from __future__ import annotations

import asyncio
import time

import pytest

from tensord.errors import DeadlineExceededError
from tensord.executor.deadlines import Queued


async def test_a_request_with_time_left_or_no_deadline_has_not_expired() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    assert Queued(10.0, 10.5, future).expired_in_queue(10.499) is None
    assert Queued(10.0, None, future).expired_in_queue(1e9) is None


async def test_a_request_taken_off_at_its_deadline_expired_in_the_queue() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    error = Queued(10.0, 10.25, future).expired_in_queue(10.25)
    assert isinstance(error, DeadlineExceededError)
    assert str(error) == "the deadline passed after 250.0 ms in the queue; the request did not run"


async def test_the_timer_fails_the_future_after_the_hook_and_the_caller_leaves() -> None:
    events: list[str] = []
    now = time.monotonic()
    entry = Queued(now, now + 0.02, asyncio.get_running_loop().create_future())
    with pytest.raises(DeadlineExceededError, match="while the request was queued or running"):
        await entry.wait_in_queue(
            lambda e: events.append(f"expired done={e.future.done()}"),
            lambda e: events.append(f"left done={e.future.done()}"),
        )
    assert events == ["expired done=False", "left done=True"]


async def test_an_answered_request_only_leaves() -> None:
    events: list[str] = []
    now = time.monotonic()
    entry: Queued[int] = Queued(now, now + 0.02, asyncio.get_running_loop().create_future())
    asyncio.get_running_loop().call_soon(entry.future.set_result, 7)
    assert await entry.wait_in_queue(lambda e: events.append("expired"), events.append) == 7
    await asyncio.sleep(0.04)  # past the deadline: the timer was cancelled
    assert events == [entry]


async def test_a_caller_that_goes_away_leaves_without_expiring() -> None:
    events: list[str] = []
    entry: Queued[int] = Queued(time.monotonic(), None, asyncio.get_running_loop().create_future())
    task = asyncio.ensure_future(
        entry.wait_in_queue(events.append, lambda e: events.append("left"))
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["left"]
