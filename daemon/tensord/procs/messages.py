"""The messages between a frontend and the engine, and how they are written into a ring.

A message is a tuple whose first item names it. It is pickled (protocol 5) with its large
buffers, the tensors, kept out of the pickle: they are copied once, straight into the
ring, and read back as views of the received record (read-only arrays, as a decoded gRPC
message gives). Both ends are the same tensord, so pickle's trust model is that of the
process itself: nothing else can write into the rings (memfds shared by fd, never named).

The frontend's data plane has checked, tokenised and admitted what it sends, for the
exact version it picked; the engine sends back token ids, and the frontend makes the text.

Frontend to engine:
    ("predict", id, pack_call(PredictCall))
    ("generate", id, pack_request(EngineCoreRequest))
    ("query", id, method, args)                 info or snapshots
    ("abort", id)                               the caller went away: cancel its work
    ("stop", [id, ...])                         stop strings ended these generations
Engine to frontend:
    ("result", id, pack_result(PredictResult))
    ("ok", id, result)                          a query's answer
    ("error", id, ErrorReport)                  a call failed (a generation was refused)
    ("tokens", pack_outputs([EngineCoreOutput, ...]))   a step's tokens for this frontend
    ("ended", [id, ...], ErrorReport | None)    generations failed, or (None) expired
    ("table", ModelTable)
Either way, ("batch", [message, ...]): the messages of one pass of the event loop.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensord import errors
from tensord.dataplane import EngineCoreRequest, PredictCall, PredictResult, TokenLogprob
from tensord.generate.core.outputs import EngineCoreOutput
from tensord.generate.core.request import RequestStatus

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def encode(message: Any) -> list[bytes | memoryview]:
    """The parts of one record: sizes, the pickle, then each out-of-band buffer."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = b"".join(_SIZE.pack(len(r)) for r in [data, *raws])
    return [_COUNT.pack(len(raws)), sizes, data, *raws]


def decode(record: bytes) -> Any:
    """The message a record holds (its buffers are views of `record`)."""
    view = memoryview(record)
    (count,) = _COUNT.unpack_from(view, 0)
    offset = _COUNT.size
    sizes = [_SIZE.unpack_from(view, offset + i * _SIZE.size)[0] for i in range(count + 1)]
    offset += (count + 1) * _SIZE.size
    parts = []
    for size in sizes:
        parts.append(view[offset : offset + size])
        offset += size
    return pickle.loads(parts[0], buffers=parts[1:])


PackedArrays = list[tuple[Any, ...]]
_PLAIN_KINDS = frozenset("biufc")
"""NumPy's own numeric kinds, whose dtype string names them whole (bfloat16 from
ml_dtypes would read back as raw bytes)."""


def pack_arrays(named: list[tuple[str, np.ndarray]]) -> PackedArrays:
    """Named tensors as plain tuples whose bytes leave the pickle (out of band): a few
    times cheaper both ways than pickling arrays and dataclasses (a Predict's tensors are
    most of a message's cost). Other arrays (BYTES, bfloat16, strided) are pickled whole."""
    packed: PackedArrays = []
    for name, array in named:
        if array.dtype.kind not in _PLAIN_KINDS or not array.flags.c_contiguous:
            packed.append((name, array))  # BYTES, bfloat16 (ml_dtypes), strided: whole
        else:
            packed.append((name, array.dtype.str, array.shape, pickle.PickleBuffer(array.data)))
    return packed


def wire_bytes(named: list[tuple[str, np.ndarray]]) -> int:
    """About the bytes the tensors take in a record: a string (BYTES) tensor is an object
    array, 8 bytes an element to NumPy, pickled with its strings whole."""
    total = 0
    for _, array in named:
        if array.dtype.kind == "O":
            total += sum(_pickled_bytes(item) for item in array.flat)
        else:
            total += array.nbytes
    return total


def _pickled_bytes(item: Any) -> int:
    """An upper bound on an element's bytes in a pickle (its header and memo included)."""
    if isinstance(item, bytes | bytearray):
        return len(item) + 16
    if isinstance(item, str):
        return (len(item) if item.isascii() else len(item.encode())) + 16
    return len(pickle.dumps(item, protocol=5))


def unpack_arrays(packed: PackedArrays) -> list[tuple[str, np.ndarray]]:
    """The tensors `pack_arrays` packed, as read-only views of the received record."""
    named = []
    for item in packed:
        if len(item) == 2:
            named.append((item[0], item[1]))
        else:
            name, dtype, shape, data = item
            named.append((name, np.frombuffer(data, dtype=dtype).reshape(shape)))
    return named


def pack_call(call: PredictCall) -> tuple[Any, ...]:
    return (call.model, call.version, pack_arrays(call.inputs), call.output_names, call.deadline)


def unpack_call(packed: tuple[Any, ...]) -> PredictCall:
    model, version, inputs, output_names, deadline = packed
    return PredictCall(model, version, unpack_arrays(inputs), output_names, deadline)


def pack_request(request: EngineCoreRequest) -> tuple[Any, ...]:
    return (
        request.model,
        request.version,
        request.prompt_token_ids,
        request.params,
        request.deadline,
        request.arrival,
        request.priority,
    )


def unpack_request(packed: tuple[Any, ...]) -> EngineCoreRequest:
    return EngineCoreRequest(*packed)


def pack_result(result: PredictResult) -> tuple[Any, ...]:
    return (
        result.model,
        result.version,
        pack_arrays(result.outputs),
        result.queue_s,
        result.compute_s,
    )


def unpack_result(packed: tuple[Any, ...]) -> PredictResult:
    model, version, outputs, queue_s, compute_s = packed
    return PredictResult(model, version, unpack_arrays(outputs), queue_s, compute_s)


PackedOutput = tuple[int, list[int], int | None, list[tuple[Any, ...]] | None]
"""(frontend's call id, new token ids, finish status or None, logprobs or None)."""


def pack_outputs(outputs: list[EngineCoreOutput], call_ids: dict[str, int]) -> list[PackedOutput]:
    """A step's outputs as plain tuples under the frontend's call ids (five times
    cheaper to pickle both ways than the dataclasses)."""
    packed: list[PackedOutput] = []
    for out in outputs:
        logprobs = None
        if out.new_logprobs is not None:
            logprobs = [(lp.token_id, lp.logprob, lp.top) for lp in out.new_logprobs]
        status = None if out.finish_status is None else int(out.finish_status)
        packed.append((call_ids[out.request_id], out.new_token_ids, status, logprobs))
    return packed


def unpack_output(packed: PackedOutput) -> EngineCoreOutput:
    """One output as the frontend's OutputStreams takes it (its id: the call id)."""
    call_id, token_ids, status, logprobs = packed
    return EngineCoreOutput(
        str(call_id),
        token_ids,
        None if status is None else RequestStatus(status),
        None,
        None if logprobs is None else [TokenLogprob(*lp) for lp in logprobs],
    )


@dataclass(slots=True, frozen=True)
class ErrorReport:
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
            return cls(type(exc).__name__, exc.message, retry)
        return cls("", f"{type(exc).__name__}: {exc}")

    def exception(self) -> Exception:
        kind = getattr(errors, self.kind, None) if self.kind else None
        if isinstance(kind, type) and issubclass(kind, errors.RateLimitedError):
            return kind(self.message, self.retry_after_s)
        if isinstance(kind, type) and issubclass(kind, errors.TensordError):
            return kind(self.message)
        return EngineFailure(self.message)


class EngineFailure(RuntimeError):
    """An unexpected error in the engine process (its log has the traceback)."""
