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
  3. look (wire.py): the model name and the counts that make parsing or decoding costly
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
from dataclasses import dataclass
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
from tensord.server.codec import MAX_RANK
from tensord.wire import LENGTH, VARINT, WireError, count_varints, fields

_PARSE_INLINE_BYTES = 256 * 1024
"""Messages up to this size are parsed on the event loop; larger ones on a worker thread."""
_SMALL_MESSAGE_BYTES = 64 * 1024
"""Health and Info requests, and a Generate's sampling parameters, are never larger."""
_COUNT_BYTES = 16 * 1024 * 1024
"""Packed token ids are counted exactly up to this many bytes (milliseconds of work);
typed integers always are (a count of 64 MiB takes tens of milliseconds)."""
MAX_NAME_BYTES = 4096
"""The longest model, tensor or output name a request may carry."""
_PARSED_INTEGER_BYTES = 8
"""What one typed integer of a request costs once parsed (protobuf keeps int64s)."""
_TYPED_INTEGER_FIELDS = frozenset({1, 2, 3})  # TensorContents bool, int32 and int64 values


@dataclass(slots=True)
class Look:
    """What a request's bytes say before they are parsed."""

    model: str = ""
    version: int = 0
    prompt_bytes: int = 0
    """Generate: the text prompt's length in bytes."""
    token_ids: int = 0
    """Generate: how many prompt_token_ids (the fewest there can be when not exact)."""
    token_ids_exact: bool = True
    parsed_extra_bytes: int = 0
    """How much more memory the parsed message takes than its wire bytes (typed integers
    packed as one-byte varints become 8 bytes each)."""


class Walk:
    """Counts the fields read; RESOURCE_EXHAUSTED past the budget. `on_model` sees the model
    name as soon as it is read (serializers write it first), so a caller who may not use
    the model learns nothing more about its request."""

    def __init__(
        self, data: bytes, limits: LimitsSettings, on_model: Callable[[str], None]
    ) -> None:
        self.data = data
        self.limits = limits
        self.left = limits.max_request_fields
        self.on_model = on_model

    def fields(self, start: int = 0, end: int | None = None) -> Iterator[Any]:
        for field in fields(self.data, start, end):
            self.left -= 1
            if self.left < 0:
                raise ResourceExhaustedError(
                    f"the request holds more than {self.limits.max_request_fields} protobuf "
                    "fields ([limits] max_request_fields); send tensors as raw_data, and "
                    "repeated numbers packed, as every proto3 library does"
                )
            yield field

    def model(self, field: Any) -> str:
        name = self.text(field, "the model name")
        self.on_model(name)
        return name

    def text(self, field: Any, what: str) -> str:
        if field.wire_type != LENGTH:
            raise WireError(f"field {field.number} should be length-delimited")
        if field.end - field.value > MAX_NAME_BYTES:
            raise InvalidArgumentError(
                f"{what} takes {field.end - field.value} bytes; names are at most "
                f"{MAX_NAME_BYTES} bytes"
            )
        try:
            return bytes(self.data[field.value : field.end]).decode()
        except UnicodeDecodeError:
            raise WireError(f"field {field.number} is not valid UTF-8") from None

    def tensor_count(self, count: int, what: str) -> int:
        """count + 1, refused past [limits] max_tensors_per_request."""
        limit = self.limits.max_tensors_per_request
        if count + 1 > limit:
            raise InvalidArgumentError(
                f"the request has more than {limit} {what}; a request takes at most {limit} "
                "([limits] max_tensors_per_request)"
            )
        return count + 1

    def typed_integers(self, count: int, instead: str) -> int:
        """`count` typed bool and integer values so far, refused past [limits]
        max_typed_integers; `instead` says how to send such tensors ("as raw_data")."""
        cap = self.limits.max_typed_integers
        if cap and count > cap:
            raise InvalidArgumentError(
                f"the request carries more than {cap} bool and integer values as typed "
                f"contents ([limits] max_typed_integers); send tensors this large {instead}"
            )
        return count

    def repeated_numbers(self, field: Any, exact: bool = False) -> tuple[int, bool]:
        """Entries of one repeated number field occurrence: 1 unpacked; packed, the count
        (or, past _COUNT_BYTES and unless `exact`, the fewest a field that long holds: a
        varint takes at most 10 bytes, and so many ids pass any model's context)."""
        if field.wire_type != LENGTH:
            return 1, True
        length = field.end - field.value
        if length > _COUNT_BYTES and not exact:
            return length // 10, False
        return count_varints(self.data, field.value, field.end), True


def _model_and_version(walk: Walk, field: Any, look: Look) -> bool:
    """Fields 1 and 2 of every request: the model name and version (True when `field` was
    one of them). Every occurrence of the name is checked: protobuf keeps the last."""
    if field.number == 1 and field.wire_type == LENGTH:
        look.model = walk.model(field)
    elif field.number == 2 and field.wire_type == VARINT:
        look.version = field.value
    else:
        return False
    return True


def _look_tensor(walk: Walk, field: Any, index: int) -> int:
    """One input Tensor: its name's length and its rank, refused past their limits before
    protobuf builds them (as the decoder would word it); the typed integers its contents
    hold."""
    rank = integers = 0
    exact = True
    name = ""
    for inner in walk.fields(field.value, field.end):
        if inner.number == 1:
            name = walk.text(inner, f"inputs[{index}]'s name")
        elif inner.number == 3:  # shape: repeated int64, packed or not
            count, counted = walk.repeated_numbers(inner)
            rank += count
            exact &= counted
        elif inner.number == 5 and inner.wire_type == LENGTH:
            for value in walk.fields(inner.value, inner.end):
                if value.number in _TYPED_INTEGER_FIELDS:
                    integers += walk.repeated_numbers(value, exact=True)[0]
    if rank > MAX_RANK:
        raise InvalidArgumentError(
            f"inputs[{index}] {name!r}: shape has rank {'' if exact else 'at least '}{rank}; "
            f"at most {MAX_RANK} dimensions are supported"
        )
    return integers


def _look_predict(walk: Walk) -> Look:
    look = Look()
    tensors = names = integers = 0
    for field in walk.fields():
        if _model_and_version(walk, field, look):
            continue
        if field.number == 3 and field.wire_type == LENGTH:
            integers += _look_tensor(walk, field, tensors)
            tensors = walk.tensor_count(tensors, "input tensors")
            walk.typed_integers(integers, "as raw_data")
        elif field.number == 4:
            walk.text(field, f"output_names[{names}]")
            names = walk.tensor_count(names, "output names")
    look.parsed_extra_bytes = integers * _PARSED_INTEGER_BYTES
    return look


def _look_generate(walk: Walk) -> Look:
    look = Look()
    sampling = 0
    for field in walk.fields():
        if _model_and_version(walk, field, look):
            continue
        if field.number == 3 and field.wire_type == LENGTH:
            look.prompt_bytes = field.end - field.value  # protobuf keeps the last one
        elif field.number == 4:
            count, exact = walk.repeated_numbers(field)
            look.token_ids += count
            look.token_ids_exact &= exact
        elif field.number == 5 and field.wire_type == LENGTH:
            sampling += field.end - field.value  # protobuf merges every occurrence
            if sampling > _SMALL_MESSAGE_BYTES:
                raise InvalidArgumentError(
                    f"sampling takes more than {_SMALL_MESSAGE_BYTES} bytes; sampling "
                    "parameters (stop strings and stop token ids included) fit in "
                    f"{_SMALL_MESSAGE_BYTES}"
                )
            for _ in walk.fields(field.value, field.end):
                pass
    look.parsed_extra_bytes = look.token_ids * _PARSED_INTEGER_BYTES
    return look


def _look_health(walk: Walk) -> Look:
    look = Look()
    for field in walk.fields():
        if field.number == 1 and field.wire_type == LENGTH:
            look.model = walk.model(field)
    return look


def _look_fields(walk: Walk) -> Look:
    """A message with no fields of its own (InfoRequest): unknown fields are only counted."""
    for _ in walk.fields():
        pass
    return Look()


_LOOKERS = {
    "Predict": _look_predict,
    "Generate": _look_generate,
    "Health": _look_health,
    "Info": _look_fields,
}


class Intake:
    """Receives and bounds the request messages of one server (see the module doc)."""

    def __init__(self, limits: LimitsSettings) -> None:
        self.limits = limits
        self.lookers: dict[str, Callable[[Walk], Look]] = dict(_LOOKERS)
        """How each RPC's request is looked at, by RPC name; other services add theirs
        (the Open Inference Protocol's, kserve_intake.py)."""
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
        if rpc in ("Health", "Info") and len(data) > _SMALL_MESSAGE_BYTES:
            raise InvalidArgumentError(
                f"a {type_name} takes {len(data)} bytes; it is never larger than "
                f"{_SMALL_MESSAGE_BYTES}"
            )
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
        if len(raw) > _SMALL_MESSAGE_BYTES:
            raise InvalidArgumentError(
                f"the request takes {len(raw)} bytes; this service's requests are never "
                f"larger than {_SMALL_MESSAGE_BYTES}"
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
