"""Trailing metadata that rides with an error status: retry hints for rate limits.

A rate-limited call ends RESOURCE_EXHAUSTED with
- `grpc-retry-pushback-ms`: gRPC's own server push-back key; a client whose retry policy
  lists RESOURCE_EXHAUSTED waits exactly that long before its retry;
- `grpc-status-details-bin`: the rich status (google.rpc.Status, carried as grpcio-status
  carries it), holding a google.rpc.RetryInfo (when to retry) and a google.rpc.QuotaFailure
  (whose quota ran out, and which), the standard details any gRPC language's status
  library decodes (`grpc_status.rpc_status.from_call` in Python);
- and the message says the same in words.
"""

from __future__ import annotations

import math

from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from tensord.errors import RateLimitedError, TensordError

RETRY_PUSHBACK = "grpc-retry-pushback-ms"


def error_trailers(exc: TensordError) -> tuple[tuple[str, str | bytes], ...]:
    """Extra trailers for this error (retry hints), or none."""
    if not isinstance(exc, RateLimitedError):
        return ()
    ms = max(1, math.ceil(round(exc.retry_after_s * 1e3, 6)))  # round: 0.995 s is 995 ms
    status = rpc_status.to_status(rate_limited_status(exc, ms))
    return ((RETRY_PUSHBACK, str(ms)), *status.trailing_metadata)


def rate_limited_status(exc: RateLimitedError, retry_ms: int) -> status_pb2.Status:
    """The rich status of a rate-limited call: its code and message, when to retry, and
    the quota that ran out (when the error names one)."""
    delay = duration_pb2.Duration(seconds=retry_ms // 1000, nanos=(retry_ms % 1000) * 1_000_000)
    details = [_packed(error_details_pb2.RetryInfo(retry_delay=delay))]
    if exc.subject:
        violation = error_details_pb2.QuotaFailure.Violation(
            subject=exc.subject, description=exc.quota
        )
        details.append(_packed(error_details_pb2.QuotaFailure(violations=[violation])))
    return status_pb2.Status(code=exc.code.value[0], message=exc.message, details=details)


def _packed(detail: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed
