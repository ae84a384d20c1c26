"""The engine's output hand-off: what goes to the event loop before which model pass."""

from __future__ import annotations

import asyncio

from tensord.generate.core.outputs import EngineCoreOutput
from tensord.generate.engine.handoff import OutputHandoff


def _out(request_id: str, token: int) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [token])


async def test_held_outputs_go_each_interval_and_first_tokens_at_once() -> None:
    delivered: list[list[EngineCoreOutput]] = []
    handoff = OutputHandoff(delivered.append, configured_interval=3)
    handoff.loop = asyncio.get_running_loop()
    a1, b1, b2 = _out("a", 1), _out("b", 2), _out("b", 3)
    handoff.hold([a1, b1], urgent=["a"])
    handoff.release_due(streams=2)  # pass 1: only a's first tokens
    await asyncio.sleep(0)
    assert delivered == [[a1]]
    handoff.hold([b2], urgent=[])
    handoff.release_due(streams=2)  # pass 2: nothing due
    await asyncio.sleep(0)
    assert delivered == [[a1]]
    handoff.release_due(streams=2)  # pass 3: the interval is up, everything held goes
    await asyncio.sleep(0)
    assert delivered == [[a1], [b1, b2]]


async def test_hand_overs_the_loop_has_not_taken_merge_and_ends_come_after() -> None:
    events: list[object] = []
    handoff = OutputHandoff(events.append, configured_interval=1)
    handoff.loop = asyncio.get_running_loop()
    x, y = _out("x", 1), _out("x", 2)
    handoff.hold([x], urgent=[])
    handoff.release_held()
    handoff.hold([y], urgent=[])
    handoff.call_after_held(events.append, "expired")  # releases y first
    await asyncio.sleep(0)
    assert events == [[x, y], "expired"]
