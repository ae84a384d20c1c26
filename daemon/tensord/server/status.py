"""Trailing metadata that rides with an error status: retry hints for rate limits.

A rate-limited call ends RESOURCE_EXHAUSTED with
- `grpc-retry-pushback-ms`: gRPC's own server push-back key; a client whose retry policy
  lists RESOURCE_EXHAUSTED waits exactly that long before its retry;
- `grpc-status-details-bin`: a google.rpc.Status holding a google.rpc.RetryInfo, the
  standard rich-error detail any gRPC language's status library decodes;
- and the message says the same in words.
"""

from __future__ import annotations

import math

from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from tensord.errors import RateLimitedError, TensordError

RETRY_PUSHBACK = "grpc-retry-pushback-ms"
STATUS_DETAILS = "grpc-status-details-bin"


def error_trailers(exc: TensordError) -> tuple[tuple[str, str | bytes], ...]:
    """Extra trailers for this error (retry hints), or none."""
    if not isinstance(exc, RateLimitedError):
        return ()
    ms = max(1, math.ceil(round(exc.retry_after_s * 1e3, 6)))  # round: 0.995 s is 995 ms
    delay = duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=exc.code.value[0], message=exc.message, details=[detail])
    return ((RETRY_PUSHBACK, str(ms)), (STATUS_DETAILS, status.SerializeToString()))
