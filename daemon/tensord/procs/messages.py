"""The messages between a frontend and the engine, and how they are written into a ring.

Every message is a typed msgspec Struct, encoded as MessagePack (field values in order,
the kind as a tag); a record is that encoding followed by the tensors' bytes, out of band:
copied once, straight into the ring, and read back as read-only views of the received
record (as a decoded gRPC message gives). Nothing on the data path is pickled. The model
table and the answers to `info` and `snapshots` (the control plane's composite snapshots,
published when something changes rather than per call) travel as a pickle inside their
message's `bytes` field, asked for by name; both ends are the same tensord, and nothing
else can write into the rings (memfds shared by fd, never named).

The frontend's data plane has checked, tokenised and admitted what it sends, for the
exact version it picked; the engine sends back token ids, and the frontend makes the text.

Frontend to engine: Predict, Embed, Generate, Query (info, snapshots), Abort (the caller went
away), Stop (stop strings ended these generations).
Engine to frontend: Result, Ok (a query's answer), Error (a call failed, or a generation
was refused), Tokens (a step's tokens for this frontend), Ended (generations failed, or
expired), Table.
Either way, Batch: the messages of one pass of the event loop.
"""

from __future__ import annotations

import pickle
import struct
import threading
from typing import Any

import msgspec
import numpy as np

from tensord import errors
from tensord.dataplane import (
    EmbedTokens,
    EngineCoreRequest,
    PredictCall,
    PredictResult,
    TokenLogprob,
)
from tensord.generate.core.outputs import EngineCoreOutput
from tensord.generate.core.request import RequestStatus

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")
_PLAIN_KINDS = frozenset("biufc")
"""NumPy's own numeric kinds, whose dtype string names them whole."""


class Tensor(msgspec.Struct, array_like=True):
    """A named tensor. `data` is the array when sent; in the record, the index of its
    out-of-band buffer (or, for an object array of BYTES, its elements)."""

    name: str
    dtype: str
    """NumPy's dtype string ('<f4'), or "object", or an ml_dtypes name ("bfloat16")."""
    shape: tuple[int, ...]
    data: Any


class ErrorReport(msgspec.Struct, array_like=True, frozen=True):
    """An exception raised in the engine, as the frontend raises it again: one of
    tensord.errors' classes by name, with its message. Anything else comes back as an
    `EngineFailure`, which the frontend answers as one process answers an unexpected
    error (INTERNAL, "the server log has the details under request id ...")."""

    kind: str
    message: str
    retry_after_s: float = 0.0

    @classmethod
    def of(cls, exc: BaseException) -> ErrorReport:
        if isinstance(exc, errors.TensordError):
            retry = exc.retry_after_s if isinstance(exc, errors.RateLimitedError) else 0.0
            return cls(type(exc).__name__, _text(exc.message), retry)
        return cls("", _text(f"{type(exc).__name__}: {exc}"))

    def exception(self) -> Exception:
        kind = getattr(errors, self.kind, None) if self.kind else None
        if isinstance(kind, type) and issubclass(kind, errors.RateLimitedError):
            return kind(self.message, self.retry_after_s)
        if isinstance(kind, type) and issubclass(kind, errors.TensordError):
            return kind(self.message)
        return EngineFailure(self.message)


def _text(message: str) -> str:
    """`message` as UTF-8 can carry it (a lone surrogate quoted from a request is escaped)."""
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return message.encode("utf-8", "backslashreplace").decode("utf-8")
    return message


class EngineFailure(RuntimeError):
    """An unexpected error in the engine process (its log has the traceback)."""


class Output(msgspec.Struct, array_like=True):
    """One generation's new tokens in a step, under the frontend's call id."""

    call_id: int
    token_ids: list[int]
    status: int | None = None
    """The finish status (RequestStatus), None while it runs."""
    logprobs: list[TokenLogprob] | None = None


class Predict(msgspec.Struct, tag=True, array_like=True):
    id: int
    model: str
    version: int
    inputs: list[Tensor]
    output_names: list[str]
    deadline: float | None


class Embed(msgspec.Struct, tag=True, array_like=True):
    """Texts' token ids (answered by a Result whose one tensor holds the vectors)."""

    id: int
    model: str
    version: int
    token_ids: Tensor
    lengths: Tensor
    deadline: float | None


class Generate(msgspec.Struct, tag=True, array_like=True):
    id: int
    request: EngineCoreRequest


class Query(msgspec.Struct, tag=True, array_like=True):
    id: int
    method: str
    args: bytes
    """The arguments, pickled (control plane)."""


class Abort(msgspec.Struct, tag=True, array_like=True):
    id: int


class Stop(msgspec.Struct, tag=True, array_like=True):
    ids: list[int]


class Result(msgspec.Struct, tag=True, array_like=True):
    id: int
    model: str
    version: int
    outputs: list[Tensor]
    queue_s: float
    compute_s: float


class Ok(msgspec.Struct, tag=True, array_like=True):
    id: int
    result: bytes
    """The answer, pickled (control plane)."""


class Error(msgspec.Struct, tag=True, array_like=True):
    id: int
    report: ErrorReport


class Tokens(msgspec.Struct, tag=True, array_like=True):
    outputs: list[Output]


class Ended(msgspec.Struct, tag=True, array_like=True):
    ids: list[int]
    report: ErrorReport | None
    """Why they failed; None: their deadlines passed."""


class Table(msgspec.Struct, tag=True, array_like=True):
    table: bytes
    """The engine's ModelTable, pickled (control plane)."""


Single = (
    Predict | Embed | Generate | Query | Abort | Stop | Result | Ok | Error | Tokens | Ended | Table
)


class Batch(msgspec.Struct, tag=True, array_like=True):
    messages: list[Single]


Message = Single | Batch

_local = threading.local()


def _enc_hook(value: Any) -> Any:
    """A tensor's array: its bytes out of band (the index goes in the record), or an
    object array's elements in it."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":
            return value.ravel().tolist()
        buffers: list[bytes | memoryview] = _local.buffers
        array = np.ascontiguousarray(value)
        buffers.append(array.reshape(-1).view(np.uint8).data if array.size else b"")
        return len(buffers) - 1
    raise NotImplementedError(f"{type(value).__name__} is not a message field")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> list[bytes | memoryview]:
    """The parts of one record: sizes, the MessagePack, then each tensor's bytes."""
    buffers: list[bytes | memoryview] = []
    _local.buffers = buffers
    try:
        data = _ENCODER.encode(message)
    finally:
        _local.buffers = None
    sizes = b"".join(_SIZE.pack(len(part)) for part in [data, *buffers])
    return [_COUNT.pack(len(buffers)), sizes, data, *buffers]


def decode(record: bytes) -> Message:
    """The message a record holds (its tensors are read-only views of `record`)."""
    view = memoryview(record)
    (count,) = _COUNT.unpack_from(view, 0)
    offset = _COUNT.size
    sizes = [_SIZE.unpack_from(view, offset + i * _SIZE.size)[0] for i in range(count + 1)]
    offset += (count + 1) * _SIZE.size
    parts = []
    for size in sizes:
        parts.append(view[offset : offset + size])
        offset += size
    message = _DECODER.decode(parts[0])
    _attach(message, parts[1:])  # object arrays too, which take no buffer
    return message


def _attach(message: Message, buffers: list[memoryview]) -> None:
    """Replace each tensor's buffer index with the array over that buffer."""
    if isinstance(message, Batch):
        for each in message.messages:
            _attach(each, buffers)
    elif isinstance(message, Predict | Result):
        for tensor in message.inputs if isinstance(message, Predict) else message.outputs:
            tensor.data = _array(tensor, buffers)
    elif isinstance(message, Embed):
        for tensor in (message.token_ids, message.lengths):
            tensor.data = _array(tensor, buffers)


def _array(tensor: Tensor, buffers: list[memoryview]) -> np.ndarray:
    if tensor.dtype == "object":
        flat = np.empty(len(tensor.data), dtype=object)
        flat[:] = tensor.data
        return flat.reshape(tensor.shape)
    return np.frombuffer(buffers[tensor.data], dtype=_dtype(tensor.dtype)).reshape(tensor.shape)


def _dtype(name: str) -> np.dtype:
    if name[:1] in "<>|=":
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.kind in _PLAIN_KINDS:
        return dtype.str
    if dtype.kind == "O":
        return "object"
    return dtype.name  # an ml_dtypes type (bfloat16, float8_*)


def tensors(named: list[tuple[str, np.ndarray]]) -> list[Tensor]:
    """Named arrays as the messages carry them (their bytes leave the record's
    MessagePack: out of band)."""
    return [Tensor(name, _dtype_name(a.dtype), a.shape, a) for name, a in named]


def named_arrays(received: list[Tensor]) -> list[tuple[str, np.ndarray]]:
    """The arrays of received tensors, by name."""
    return [(tensor.name, tensor.data) for tensor in received]


def wire_bytes(named: list[tuple[str, np.ndarray]]) -> int:
    """About the bytes the tensors take in a record: a string (BYTES) tensor is an object
    array, 8 bytes an element to NumPy, encoded with its strings whole."""
    total = 0
    for _, array in named:
        if array.dtype.kind == "O":
            total += sum(_element_bytes(item) for item in array.flat)
        else:
            total += array.nbytes
    return total


def _element_bytes(item: Any) -> int:
    """An upper bound on an element's bytes in the record."""
    if isinstance(item, bytes | bytearray):
        return len(item) + 8
    if isinstance(item, str):
        return (len(item) if item.isascii() else len(item.encode())) + 8
    return len(msgspec.msgpack.encode(item)) + 8


def predict(call_id: int, call: PredictCall) -> Predict:
    return Predict(
        call_id, call.model, call.version, tensors(call.inputs), call.output_names, call.deadline
    )


def call_of(message: Predict) -> PredictCall:
    return PredictCall(
        message.model,
        message.version,
        named_arrays(message.inputs),
        message.output_names,
        message.deadline,
    )


def embed(call_id: int, call: EmbedTokens) -> Embed:
    ids, lengths = tensors([("token_ids", call.token_ids), ("lengths", call.lengths)])
    return Embed(call_id, call.model, call.version, ids, lengths, call.deadline)


def embed_of(message: Embed) -> EmbedTokens:
    return EmbedTokens(
        message.model,
        message.version,
        message.token_ids.data,
        message.lengths.data,
        message.deadline,
    )


def result(call_id: int, done: PredictResult) -> Result:
    return Result(
        call_id, done.model, done.version, tensors(done.outputs), done.queue_s, done.compute_s
    )


def result_of(message: Result) -> PredictResult:
    return PredictResult(
        message.model,
        message.version,
        named_arrays(message.outputs),
        message.queue_s,
        message.compute_s,
    )


def query(call_id: int, method: str, args: tuple[Any, ...]) -> Query:
    return Query(call_id, method, pickle.dumps(args, protocol=5))


def ok(call_id: int, answer: Any) -> Ok:
    return Ok(call_id, pickle.dumps(answer, protocol=5))


def table(model_table: Any) -> Table:
    return Table(pickle.dumps(model_table, protocol=5))


def unpickled(data: bytes) -> Any:
    """A control-plane field's value (Query.args, Ok.result, Table.table)."""
    return pickle.loads(data)


def tokens(outputs: list[EngineCoreOutput], call_ids: dict[str, int]) -> Tokens:
    """A step's outputs under the frontend's call ids."""
    return Tokens(
        [
            Output(
                call_ids[out.request_id],
                out.new_token_ids,
                None if out.finish_status is None else int(out.finish_status),
                out.new_logprobs,
            )
            for out in outputs
        ]
    )


def output_of(output: Output) -> EngineCoreOutput:
    """One output as the frontend's OutputStreams takes it (its id: the call id)."""
    return EngineCoreOutput(
        str(output.call_id),
        output.token_ids,
        None if output.status is None else RequestStatus(output.status),
        None,
        output.logprobs,
    )
