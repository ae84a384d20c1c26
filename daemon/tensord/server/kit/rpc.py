"""Per-call plumbing shared by every RPC: request ids, error mapping, access logs.

One decorator per RPC shape keeps the servicer at three lines a method: errors carry
their own status (tensord.errors) and are mapped here, and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from tensord.errors import ResourceExhaustedError, TensordError
from tensord.inflight import InflightCounter
from tensord.server.kit.intake import Intake
from tensord.server.kit.look import Look
from tensord.server.kit.status import error_trailers
from tensord.server.watchdog import is_probe

log = structlog.get_logger("tensord.request")

REQUEST_ID = "x-request-id"
_MAX_ID_LENGTH = 128
_MAX_MESSAGE = 2048
"""Longest status message sent or logged: a message may quote the request (a name, a
shape), and gRPC refuses trailers over 16 KiB, which would turn the status into
RESOURCE_EXHAUSTED."""
# Failures that are the caller's doing are routine; they are logged at info, not error.
_CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)

Resp = TypeVar("Resp", bound=Message)
Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


_DURING_DRAIN = frozenset({"Health", "Info", "ServerLive", "ServerReady", "ModelReady"})
"""Calls served while a drain runs (the data plane answers NOT_SERVING for Health, and not
ready for the Open Inference Protocol's ServerReady and ModelReady)."""

# Made-up ids: a random per-process prefix and a counter, 32 hex digits, unique without
# paying for uuid4 on every call.
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count(1)


class CallsInFlight(InflightCounter):
    """Handlers running now. The drain waits for none before it stops gRPC, so that the
    replies they returned are on the wire before connections close."""

    __slots__ = ("drain_reply_bytes", "draining")

    def __init__(self) -> None:
        super().__init__()
        self.draining = False
        """Set when the drain begins: from then on the replies' sizes are counted."""
        self.drain_reply_bytes = 0
        """Bytes of the unary replies returned since the drain began (the drain gives them
        time to leave before gRPC closes the connections)."""


class StreamSlots:
    """At most `limit` Generate streams at once across the daemon ([limits]
    max_generate_streams); more get RESOURCE_EXHAUSTED at once. A call takes its slot once
    its request has arrived and passed its checks, so calls whose message has not arrived
    (or that are refused) hold none; the slot is given back when the stream ends, fails or
    is cancelled. Check and take happen with no await between them: calls arriving
    together cannot overshoot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a slot for the block; ResourceExhaustedError when none is free."""
        self.take()
        try:
            yield
        finally:
            self.give()

    def take(self) -> None:
        """Take a slot (give it back with `give`); ResourceExhaustedError when none is
        free."""
        if self.active >= self.limit:
            raise ResourceExhaustedError(
                f"{self.active} Generate streams are in progress, the most this server "
                f"takes ([limits] max_generate_streams = {self.limit}); retry shortly"
            )
        self.active += 1

    def give(self) -> None:
        self.active -= 1


def request_id(context: Ctx) -> str:
    """The caller's x-request-id when it is sane (printable, <= 128 chars), else a new one."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID and isinstance(value, str):
            if 0 < len(value) <= _MAX_ID_LENGTH and value.isprintable():
                return value
            break
    return new_request_id()


def new_request_id() -> str:
    """A fresh request id: the process's random prefix and a counter, 32 hex digits."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def sane_request_id(value: str | None) -> bool:
    """Whether a caller's request id is kept: printable, 1 to 128 characters."""
    return value is not None and 0 < len(value) <= _MAX_ID_LENGTH and value.isprintable()


def _observe(
    servicer: Any,
    rpc: str,
    request: Any,
    code: grpc.StatusCode,
    start: float,
    rid: str,
    context: Ctx,
    message: str = "",
) -> None:
    """Hand the finished call to the servicer's observer (metrics, tracing), if it has one."""
    observer = getattr(servicer, "observer", None)
    if observer is None:
        return
    if rpc == "Health" and is_probe(context.invocation_metadata()):
        return  # the daemon's own watchdog, not a client
    elapsed = time.perf_counter() - start
    observer.finished(rpc, _model_of(request), code, elapsed, rid, context, message)


def _model_of(request: Any) -> str:
    """The model a request names: `model` in tensord.v1, `model_name` (ModelInfer) or
    `name` (the other model requests) in the Open Inference Protocol."""
    for field in ("model", "model_name", "name"):
        model = getattr(request, field, None)
        if isinstance(model, str):
            return model
    return ""


Trailers = tuple[tuple[str, str | bytes], ...]


def failure_status(
    exc: BaseException, rid: str, rpc: str, total_ms: float | None = None
) -> tuple[grpc.StatusCode, str, Trailers]:
    """Log a failed call once and say how it ends: status, message, and trailers (the
    request id, and an error's retry hints). The one mapping of errors to statuses, for the
    RPC decorators and the interceptors alike; `total_ms` is how long the call ran, if
    known."""
    timing = {} if total_ms is None else {"total_ms": total_ms}
    trailers: Trailers = ((REQUEST_ID, rid),)
    if isinstance(exc, TensordError):
        code, message = exc.code, _bounded(exc.message)
        trailers += error_trailers(exc)
        fields = {"request_id": rid, "rpc": rpc, "status": code.name, "error": message}
        if code in _CLIENT_CODES:
            log.info("request.rejected", **fields, **timing)
        else:
            log.error("request.failed", **fields, **timing, exc_info=exc)
        return code, message, trailers
    code = grpc.StatusCode.INTERNAL
    message = f"internal error; the server log has the details under request id {rid}"
    log.error(
        "request.failed",
        request_id=rid,
        rpc=rpc,
        status=code.name,
        error=repr(exc),
        **timing,
        exc_info=exc,
    )
    return code, message, trailers


async def _fail(
    servicer: Any, request: Any, context: Ctx, rid: str, rpc: str, start: float, exc: BaseException
) -> None:
    """Log a failure once and end the call with its status; the id rides in the trailers."""
    total_ms = round((time.perf_counter() - start) * 1e3, 3)
    code, message, trailers = failure_status(exc, rid, rpc, total_ms)
    _observe(servicer, rpc, request, code, start, rid, context, message)
    _drop_tracebacks(exc)
    await context.abort(code, message, trailing_metadata=trailers)


def _cancelled(servicer: Any, rpc: str, request: Any, start: float, rid: str, context: Ctx) -> None:
    """Record a call gRPC ended under the handler: the client's deadline passed (what the
    client sees is DEADLINE_EXCEEDED) or the client went away (CANCELLED)."""
    remaining = context.time_remaining()
    code = (
        grpc.StatusCode.DEADLINE_EXCEEDED
        if remaining is not None and remaining <= 0
        else grpc.StatusCode.CANCELLED
    )
    log.info("request.cancelled", request_id=rid, rpc=rpc, status=code.name)
    _observe(servicer, rpc, request, code, start, rid, context)


def _bounded(message: str) -> str:
    if len(message) <= _MAX_MESSAGE:
        return message
    return f"{message[:_MAX_MESSAGE]}... ({len(message) - _MAX_MESSAGE} more characters)"


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Detach the tracebacks of a logged error and its causes. A traceback holds its frames,
    and a frame that raised inside `except ... as e` holds `e`: a cycle that keeps the
    request's arrays alive until the cycle collector runs, not when the call ends."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


class Admission(Protocol):
    """What the RPC decorators need of a servicer: its calls in flight, its intake, and the
    checks a request's bytes must pass before they are parsed."""

    calls: CallsInFlight
    intake: Intake

    def check_model(self, rpc: str, model: str) -> None: ...

    def check_look(self, rpc: str, look: Look) -> Any:
        """Checks on what the request's bytes say; returns what the handler is given as
        its `target` (the version a Predict or Generate call goes to), or None."""

    def admitted(self, rpc: str) -> contextlib.AbstractContextManager[None]: ...


def _look(
    servicer: Admission, rpc: str, raw: bytes, message_type: Any, held: Any
) -> tuple[Look, Any]:
    """What the request's bytes say, once they passed the intake's look and the servicer's
    checks (authorization, the model's limits), and the handler's target; `held` is the
    call's stand-in for logs and metrics until it is parsed (it takes the looked-at model
    name)."""

    def seen(model: str) -> None:
        held.model = model
        servicer.check_model(rpc, model)

    look = servicer.intake.look(rpc, raw, message_type.DESCRIPTOR.full_name, seen)
    return look, servicer.check_look(rpc, look)


@contextlib.contextmanager
def _admitted(servicer: Admission, rpc: str, raw: bytes, look: Look) -> Iterator[None]:
    """The call holds its part of the in-flight budget (its bytes, and what parsing adds),
    counts as in flight, and holds whatever the servicer admits it with (a Generate
    stream's slot) for the block."""
    with (
        servicer.intake.budget(len(raw) + look.parsed_extra_bytes),
        servicer.calls,
        servicer.admitted(rpc),
    ):
        yield


@dataclass(slots=True)
class _Held:
    """A call before its request is parsed: what logs and metrics need of it."""

    model: str = ""


@dataclass(slots=True)
class _Call:
    """One call being served: its request (a _Held until parsed) and the handler's target."""

    start: float
    rid: str
    request: Any
    target: Any = None


@contextlib.asynccontextmanager
async def _serving(
    servicer: Any, rpc: str, message_type: Any, context: Ctx
) -> AsyncIterator[_Call]:
    """Every call's life, whatever its shape: its request id, its message received,
    looked at, admitted and parsed; the block runs the handler; then the call is
    observed, or ends with its error's status (the one mapping, _fail), or is logged as
    cancelled."""
    call = _Call(time.perf_counter(), request_id(context), _Held())
    context.set_trailing_metadata(((REQUEST_ID, call.rid),))
    try:
        raw = await servicer.intake.receive(context, rpc in _DURING_DRAIN)
        look, call.target = _look(servicer, rpc, raw, message_type, call.request)
        with _admitted(servicer, rpc, raw, look):
            call.request = await servicer.intake.parse(message_type, raw)
            yield call
    except (asyncio.CancelledError, GeneratorExit):
        _cancelled(servicer, rpc, call.request, call.start, call.rid, context)
        raise
    except Exception as exc:
        await _fail(servicer, call.request, context, call.rid, rpc, call.start, exc)
        raise AssertionError("unreachable: abort raises") from exc
    _observe(servicer, rpc, call.request, grpc.StatusCode.OK, call.start, call.rid, context)


def unary_rpc(
    message_type: Any,
) -> Callable[[Callable[[Any, Any, Ctx, str, Any], Awaitable[Any]]], Any]:
    """Wrap a unary handler `(self, request, context, request_id, target) -> response`
    (`target`: what the servicer's check_look returned), served as request-streaming with
    raw bytes (intake.py): the message is received, bounded and parsed here."""

    def wrap(method: Callable[[Any, Any, Ctx, str, Any], Awaitable[Resp]]) -> Any:
        rpc = method.__name__

        @functools.wraps(method)
        async def handler(self: Any, request_iterator: Any, context: Ctx) -> Resp:
            async with _serving(self, rpc, message_type, context) as call:
                response = await method(self, call.request, context, call.rid, call.target)
                if self.calls.draining:
                    self.calls.drain_reply_bytes += response.ByteSize()
            return response

        return handler

    return wrap


def stream_rpc(
    message_type: Any,
) -> Callable[[Callable[[Any, Any, Ctx, str, Any], AsyncIterator[Any]]], Any]:
    """Wrap a server-streaming handler like unary_rpc; chunks already sent stay valid on
    failure."""

    def wrap(method: Callable[[Any, Any, Ctx, str, Any], AsyncIterator[Resp]]) -> Any:
        rpc = method.__name__

        @functools.wraps(method)
        async def handler(self: Any, request_iterator: Any, context: Ctx) -> AsyncIterator[Resp]:
            async with _serving(self, rpc, message_type, context) as call:
                async for item in method(self, call.request, context, call.rid, call.target):
                    yield item

        return handler

    return wrap
