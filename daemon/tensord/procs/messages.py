"""The messages between a frontend and the engine, and how they are written into a ring.

A message is a tuple whose first item names it. It is pickled (protocol 5) with its large
buffers, the tensors, kept out of the pickle: they are copied once, straight into the
ring, and read back as views of the received record (read-only arrays, as a decoded gRPC
message gives). Both ends are the same tensord, so pickle's trust model is that of the
process itself: nothing else can write into the rings (memfds shared by fd, never named).

Frontend to engine:
    ("predict", id, principal, PredictCall)
    ("generate", id, principal, GenerateCall)
    ("call", id, principal, method, args)      a data plane query (info, chat_prompt, ...)
    ("abort", id)                              the caller went away: cancel its work
Engine to frontend:
    ("ok", id, result)
    ("error", id, ErrorReport)
    ("chunks", [(id, RequestOutput | None), ...])  Generate chunks of one step; None ends
    ("table", ModelTable)
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

from tensord import errors

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


@dataclass(slots=True, frozen=True)
class ErrorReport:
    """An exception raised in the engine, as the frontend raises it again: one of
    tensord.errors' classes by name, with its message (anything else is INTERNAL)."""

    kind: str
    message: str
    retry_after_s: float = 0.0

    @classmethod
    def of(cls, exc: BaseException) -> ErrorReport:
        if isinstance(exc, errors.TensordError):
            retry = exc.retry_after_s if isinstance(exc, errors.RateLimitedError) else 0.0
            return cls(type(exc).__name__, exc.message, retry)
        return cls("InternalError", f"the engine failed: {type(exc).__name__}: {exc}")

    def exception(self) -> errors.TensordError:
        kind = getattr(errors, self.kind, None)
        if isinstance(kind, type) and issubclass(kind, errors.RateLimitedError):
            return kind(self.message, self.retry_after_s)
        if isinstance(kind, type) and issubclass(kind, errors.TensordError):
            return kind(self.message)
        return errors.InternalError(self.message)
