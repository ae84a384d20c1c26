"""Request intake: each tensord.v1 call's message taken as bytes and bounded before parsing.

gRPC would parse a unary request on the event loop before the handler runs, and parsing
millions of tiny fields holds the interpreter lock for seconds; it would also never run a
handler whose message does not arrive. So the servicer's methods are registered as
request-streaming with no deserializer, and each call goes through here first:

  1. receive: the one message within `[limits] receive_timeout_seconds`
     (DEADLINE_EXCEEDED), or INVALID_ARGUMENT when the call ends without one; a drain
     ends the calls still waiting at once (UNAVAILABLE);
  2. budget: the bytes of requests in progress stay under `[limits]
     max_request_bytes_in_flight` (RESOURCE_EXHAUSTED beyond);
  3. look (look.py): the model name and the counts that make parsing or decoding costly
     (tensors, output names, token ids, prompt bytes, protobuf fields), stopping as soon as
     a limit is passed;
  4. parse, on a worker thread when the message is large.

The caller checks authorization and the model's own limits between 3 and 4, so a refused
request is never parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from tensord.config_tables import LimitsSettings
from tensord.dataplane import NOT_SERVING
from tensord.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ResourceExhaustedError,
    TensordError,
    UnavailableError,
)
from tensord.server.kit.look import SMALL_MESSAGE_BYTES, Look, Walk
from tensord.wire import WireError

_PARSE_INLINE_BYTES = 256 * 1024
"""Messages up to this size are parsed on the event loop; larger ones on a worker thread."""


class Intake:
    """Receives and bounds the request messages of one server (see the module doc)."""

    def __init__(self, limits: LimitsSettings) -> None:
        self.limits = limits
        self.lookers: dict[str, Callable[[Walk], Look]] = {}
        """How each RPC's request is looked at, by RPC name: each protocol's servicer adds
        its own (tensord_v1/intake.py, kserve/intake.py)."""
        self.bytes_in_flight = 0
        self._closing = asyncio.Event()
        self._stopping = asyncio.Event()

    async def receive(
        self, context: grpc.aio.ServicerContext[Any, Any], during_drain: bool = False
    ) -> bytes:
        """The call's one request message, as bytes. A drain refuses new calls and ends
        those still waiting, except `during_drain` ones (health, which load balancers poll
        while the drain delay runs): those end only when gRPC stops."""
        ended = self._stopping if during_drain else self._closing
        if ended.is_set():
            raise UnavailableError(NOT_SERVING)
        read = asyncio.ensure_future(context.read())
        closing = asyncio.ensure_future(ended.wait())
        try:
            done, _ = await asyncio.wait(
                (read, closing),
                timeout=self.limits.receive_timeout_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            closing.cancel()
            if not read.done():
                # Left to gRPC, which ends it with the call: cancelling a read in progress
                # leaves the call unable to send its status.
                read.add_done_callback(_consume)
        if read not in done:
            if closing in done:
                raise UnavailableError(
                    "the server is draining and the request message had not arrived; retry "
                    "on another instance"
                )
            raise DeadlineExceededError(
                f"the request message did not arrive within "
                f"{self.limits.receive_timeout_seconds:g} s ([limits] receive_timeout_seconds)"
            )
        message = read.result()
        if message is grpc.aio.EOF:
            raise InvalidArgumentError("the call ended without a request message; send exactly one")
        return bytes(message)

    def close(self) -> None:
        """Drain: calls still waiting for their message end now, and new ones at once
        (health aside, until stop())."""
        self._closing.set()

    def stop(self) -> None:
        """gRPC is stopping: every call still waiting for its message ends now."""
        self._closing.set()
        self._stopping.set()

    @contextlib.contextmanager
    def budget(self, size: int) -> Iterator[None]:
        """Hold `size` bytes of the in-flight budget for the block."""
        cap = self.limits.max_request_bytes_in_flight
        if cap and self.bytes_in_flight + size > cap:
            raise ResourceExhaustedError(
                f"requests holding {self.bytes_in_flight} bytes are in progress; this one "
                f"({size} bytes) would pass the {cap} the server holds at once ([limits] "
                "max_request_bytes_in_flight); retry shortly"
            )
        self.bytes_in_flight += size
        try:
            yield
        finally:
            self.bytes_in_flight -= size

    def look(
        self,
        rpc: str,
        data: bytes,
        type_name: str,
        on_model: Callable[[str], None] = lambda name: None,
    ) -> Look:
        """What the bytes say, or INVALID_ARGUMENT / RESOURCE_EXHAUSTED past a limit;
        `on_model(name)` runs as soon as the model name is read (an authorization check)."""
        try:
            return self.lookers[rpc](Walk(data, self.limits, on_model))
        except WireError as exc:
            raise InvalidArgumentError(
                f"the request is not a valid {type_name} message ({exc}); check the client's "
                f"stubs against the server's contract ({type_name.rpartition('.')[0]})"
            ) from None

    async def parse(self, message_type: Any, data: bytes) -> Any:
        """The parsed message (on a worker thread when large); INVALID_ARGUMENT for bytes
        protobuf refuses. A call cancelled meanwhile returns only once the parse is over,
        so that the budget it holds covers the parse's memory to the end."""
        from google.protobuf.message import DecodeError

        try:
            if len(data) <= _PARSE_INLINE_BYTES:
                return message_type.FromString(data)
            parsing = asyncio.ensure_future(asyncio.to_thread(message_type.FromString, data))
            try:
                return await asyncio.shield(parsing)
            except asyncio.CancelledError:
                # The thread parses on: its memory stays counted in the budget until done.
                await asyncio.wait((parsing,))
                raise
        except DecodeError as exc:
            raise InvalidArgumentError(
                f"the request is not a valid {message_type.DESCRIPTOR.full_name} message "
                f"({exc}); check the client's stubs against the server's contract "
                f"({message_type.DESCRIPTOR.file.package})"
            ) from None


def bounded_handlers(
    handlers: dict[str, grpc.RpcMethodHandler], intake: Intake
) -> dict[str, grpc.RpcMethodHandler]:
    """Another service's handlers (grpc.health.v1) with their one request message received
    through `intake`: the same receive deadline, the same end at a drain."""
    wrapped = {}
    for name, handler in handlers.items():
        if handler.request_streaming:
            wrapped[name] = handler
        elif handler.response_streaming:
            wrapped[name] = grpc.stream_stream_rpc_method_handler(
                _bounded_stream(handler, intake), response_serializer=handler.response_serializer
            )
        else:
            wrapped[name] = grpc.stream_unary_rpc_method_handler(
                _bounded_unary(handler, intake), response_serializer=handler.response_serializer
            )
    return wrapped


async def _received(handler: grpc.RpcMethodHandler, intake: Intake, context: Any) -> Any:
    """The call's request, parsed with the handler's own deserializer; the call ends with
    the status of whatever goes wrong."""
    from google.protobuf.message import DecodeError

    try:
        raw = await intake.receive(context, during_drain=True)
        if len(raw) > SMALL_MESSAGE_BYTES:
            raise InvalidArgumentError(
                f"the request takes {len(raw)} bytes; this service's requests are never "
                f"larger than {SMALL_MESSAGE_BYTES}"
            )
        return handler.request_deserializer(raw)
    except TensordError as exc:
        await context.abort(exc.code, exc.message)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid request ({exc})")


def _bounded_unary(handler: grpc.RpcMethodHandler, intake: Intake) -> Any:
    async def unary(request_iterator: Any, context: Any) -> Any:
        return await handler.unary_unary(await _received(handler, intake, context), context)

    return unary


def _bounded_stream(handler: grpc.RpcMethodHandler, intake: Intake) -> Any:
    async def stream(request_iterator: Any, context: Any) -> Any:
        result = handler.unary_stream(await _received(handler, intake, context), context)
        if hasattr(result, "__aiter__"):
            async for item in result:
                yield item
        else:  # a coroutine that writes with context.write
            await result

    return stream


def _consume(read: asyncio.Future[Any]) -> None:
    """Retrieve a left read's outcome, so that asyncio does not log it as never retrieved."""
    if not read.cancelled():
        read.exception()
