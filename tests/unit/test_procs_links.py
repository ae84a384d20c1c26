"""The engine's and a frontend's ends of a link, over real rings in one process."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tensord.dataplane import ModelTable, PredictCall, PredictResult, Readiness
from tensord.procs.engine import EngineHost
from tensord.procs.messages import pack_call
from tensord.procs.ring import Ring


class SlowPlane:
    """The data plane calls an engine makes: a Predict that takes its time."""

    def __init__(self) -> None:
        self.started = 0

    def table(self, loaded: bool) -> ModelTable:
        return ModelTable(loaded, Readiness(loaded, ""))

    async def predict(self, call: PredictCall) -> PredictResult:
        self.started += 1
        await asyncio.sleep(10)
        raise AssertionError("not reached")


def _host(plane: Any) -> tuple[EngineHost, Ring, Ring]:
    requests, replies = Ring.create(1 << 16), Ring.create(1 << 16)
    host = EngineHost(plane)
    host.add_frontend(0, replies, requests)
    return host, requests, replies


async def test_an_abort_read_with_its_call_leaves_no_task_behind() -> None:
    plane = SlowPlane()
    host, _requests, _replies = _host(plane)
    frontend = host.frontends[0]
    call = PredictCall("m", 0, [("x", np.zeros(4, np.float32))], [], None)
    # The call and its abort in one read of the ring: the task is cancelled before it runs.
    frontend._received(("batch", [("predict", 7, None, pack_call(call)), ("abort", 7)]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert plane.started == 0
    assert frontend.tasks == {}, "the aborted call's task (and its tensors) stays held"
    host.close()
