"""The engine's and a frontend's ends of a link, over real rings in one process."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np

from tensord.dataplane import ModelTable, PredictCall, PredictResult, Readiness
from tensord.procs import messages
from tensord.procs.engine import EngineHost
from tensord.procs.ring import Ring


class SlowEngine:
    """The LocalEngine calls an engine host makes: a Predict that takes its time."""

    def __init__(self) -> None:
        self.started = 0
        self.table = ModelTable(True, Readiness(True, ""))
        self.on_table: Any = None

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
    plane = SlowEngine()
    host, _requests, _replies = _host(plane)
    frontend = host.frontends[0]
    call = PredictCall("m", 0, [("x", np.zeros(4, np.float32))], [], None)
    # The call and its abort in one read of the ring: the task is cancelled before it runs.
    frontend._received(messages.Batch([messages.predict(7, call), messages.Abort(7)]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert plane.started == 0
    assert frontend.tasks == {}, "the aborted call's task (and its tensors) stays held"
    host.close()


async def test_string_tensors_are_counted_at_their_size_in_the_ring() -> None:
    """BYTES tensors are object arrays (8 bytes an element to NumPy): calls whose strings
    are larger than that, posted in one pass, must not be grouped past a record's limit
    (the group was refused by the ring, every call in it lost)."""
    from tensord.config import TensordConfig
    from tensord.procs.messages import decode
    from tensord.procs.remote import RemoteEngine

    requests, replies = Ring.create(1 << 20), Ring.create(1 << 20)
    remote = RemoteEngine(TensordConfig())
    remote.attach(requests, replies)
    loop = asyncio.get_running_loop()
    failures: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: failures.append(context))
    calls = []
    for i in range(3):
        strings = np.array([bytes([i]) * (300 * 1024)], dtype=object)
        call = PredictCall("m", 0, [("s", strings)], [], None)
        calls.append(asyncio.ensure_future(remote.predict(call)))
    for _ in range(5):
        await asyncio.sleep(0)
    received = []
    while True:
        batch = requests.read_available()
        if not batch:
            break
        received += batch
        for record in batch:
            message = decode(record)
            for each in message.messages if isinstance(message, messages.Batch) else [message]:
                assert isinstance(each, messages.Predict)
                remote._received(messages.Error(each.id, _report()))
    assert failures == []
    await asyncio.wait(calls, timeout=1)
    assert failures == []
    assert all(call.done() for call in calls), "calls lost on the way to the engine"
    for call in calls:
        call.exception()
    remote.detach()


def _report() -> Any:
    from tensord.procs.messages import ErrorReport

    return ErrorReport("UnavailableError", "test")


async def test_a_backlog_is_written_as_the_other_end_frees_space() -> None:
    """Four times what the ring holds, sent at once: the excess waits in the backlog and is
    written, in order, each time the reader's progress rings the space doorbell."""
    from tensord.procs.link import Link

    forth, back = Ring.create(1024), Ring.create(1024)
    got: list[Any] = []
    done = asyncio.Event()
    total = 40

    def received(message: Any) -> None:
        got.append(message)
        if len(got) == total:
            done.set()

    sender = Link(forth, back, lambda message: None)
    receiver = Link(back, forth, received)
    sender.open()
    payload = b"x" * 90  # ~100 bytes a record: ten fit the ring
    for i in range(total):
        sender.send(messages.Query(i, "info", payload))
    assert sender.backlog > 0
    receiver.open()  # reads what is there, which rings the space doorbell, and so on
    await asyncio.wait_for(done.wait(), 5)
    assert [message.id for message in got] == list(range(total))
    assert sender.backlog == 0
    sender.close()
    receiver.close()


async def test_a_message_that_cannot_be_sent_fails_its_call_at_once() -> None:
    """A stop string no UTF-8 can carry (the HTTP API refuses it first) reaches the link:
    its generation fails with INTERNAL instead of waiting for an answer that never comes,
    and the calls posted beside it still go."""
    from tensord.config import TensordConfig
    from tensord.dataplane import EngineCoreRequest
    from tensord.errors import InternalError
    from tensord.generate.core.sampling_params import GenerationDefaults, SamplingParams
    from tensord.procs.messages import decode
    from tensord.procs.remote import RemoteEngine

    class Sink:
        def __init__(self) -> None:
            self.failures: list[Exception] = []

        def outputs(self, outputs: Any) -> None: ...
        def expired(self, request_ids: Any) -> None: ...
        def failed(self, request_ids: Any, error: Exception) -> None:
            self.failures.append(error)

    requests, replies = Ring.create(1 << 22), Ring.create(1 << 22)
    remote = RemoteEngine(TensordConfig())
    remote.attach(requests, replies)
    params = SamplingParams(max_tokens=4, stop=("\ud800",)).resolve(
        GenerationDefaults(), prompt_len=2, max_model_len=16, vocab_size=32
    )
    bad, good = Sink(), Sink()
    remote.add_generation(EngineCoreRequest("m", 1, [1, 2], params, None, 0.0), bad)
    fine = dataclasses.replace(params, stop=("ok",))
    remote.add_generation(EngineCoreRequest("m", 1, [1, 2], fine, None, 0.0), good)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(bad.failures) == 1 and isinstance(bad.failures[0], InternalError)
    assert good.failures == []
    sent = [decode(record) for record in requests.read_available()]
    assert [type(m).__name__ for m in sent] == ["Generate"]
    remote.detach()
