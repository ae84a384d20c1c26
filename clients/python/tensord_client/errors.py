"""Typed errors: one class per status code a tensord call can end with.

Every class is a grpc.RpcError (more exactly a grpc.aio.AioRpcError, which both clients
raise), so code that catches gRPC's own errors, or calls `code()`, `details()` and
`trailing_metadata()`, keeps working. Catch the class for the situation instead:

    try:
        client.predict("mlp", inputs)
    except tensord_client.NotFound:          # unknown model or version
        ...
    except tensord_client.ResourceExhausted as exc:
        time.sleep(exc.retry_after or 1.0)   # queue full or rate limited

`Unavailable` is the one the clients already retry (model loading, server draining);
`FailedPrecondition` (a model that failed to load, Generate on a non-generator) is not
worth retrying until an operator acts.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

REQUEST_ID = "x-request-id"
RETRY_PUSHBACK = "grpc-retry-pushback-ms"


class TensordError(grpc.aio.AioRpcError):
    """A call that ended with a status other than OK: `code()` and `details()` say which
    and why, `request_id` names the call in the daemon's logs."""

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"

    @property
    def request_id(self) -> str | None:
        """The x-request-id the daemon echoed (the caller's, or one it made)."""
        return _trailer(self, REQUEST_ID)

    def __reduce__(self) -> tuple[Any, ...]:
        # The sync client's metadata entries are a namedtuple pickle cannot find by name.
        return (
            type(self),
            (
                self.code(),
                _plain(self.initial_metadata()),
                _plain(self.trailing_metadata()),
                self.details(),
                self.debug_error_string(),
            ),
        )


class InvalidArgument(TensordError):
    """A bad tensor name, dtype, shape or byte length; a bad sampling parameter; a prompt
    too long. Fix the request: retrying it cannot help."""


class NotFound(TensordError):
    """No such model, or no such version of it."""


class Unavailable(TensordError):
    """The model is loading or unloading, the server is draining, or it cannot be reached;
    the clients retry these (`retries`) before raising."""


class FailedPrecondition(TensordError):
    """The model failed to load (the reason is in the message, and in health), or it cannot
    do this call (Generate on a model that is not a generator)."""


class ResourceExhausted(TensordError):
    """A full queue, a rate limit, a message too large, or no memory for the batch;
    `retry_after` is the wait the server asked for, when it asked."""

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before the next call, from the server's push-back hint."""
        return retry_after(self)


class DeadlineExceeded(TensordError):
    """The deadline passed while the call waited or ran."""


class Cancelled(TensordError):
    """The call was cancelled (by this client, or by its channel closing)."""


class Unauthenticated(TensordError):
    """No token, or one that the daemon does not know."""


class PermissionDenied(TensordError):
    """A valid token that may not use this model."""


class Unimplemented(TensordError):
    """A call this server does not offer."""


class Internal(TensordError):
    """A backend or device failure on the server; it is logged there with the request id."""


_CLASSES: dict[grpc.StatusCode, type[TensordError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
}


def error_class(code: grpc.StatusCode) -> type[TensordError]:
    """The class raised for a status code (TensordError itself for the codes tensord does
    not send, such as UNKNOWN)."""
    return _CLASSES.get(code, TensordError)


def from_rpc_error(error: grpc.RpcError) -> grpc.RpcError:
    """The typed error for a failed call; an error that carries no status is returned
    as it is."""
    if isinstance(error, TensordError) or not callable(getattr(error, "code", None)):
        return error
    # The metadata stays as each client gives it (grpc.aio.Metadata from the asyncio one,
    # (key, value) tuples from the sync one), so code written against either keeps working.
    call: grpc.Call = error
    code = call.code()
    return error_class(code)(
        code,
        call.initial_metadata(),
        call.trailing_metadata(),
        call.details(),
        error.debug_error_string() if hasattr(error, "debug_error_string") else None,
    )


def _plain(metadata: Any) -> Any:
    if metadata is None or isinstance(metadata, grpc.aio.Metadata):
        return metadata
    return tuple((key, value) for key, value in metadata)


def _trailer(error: grpc.RpcError, key: str) -> str | None:
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for name, value in trailers or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def retry_after(error: grpc.RpcError) -> float | None:
    """Seconds the server asked the caller to wait (a rate limit's push-back), if any."""
    value = _trailer(error, RETRY_PUSHBACK)
    try:
        return int(value) / 1e3 if value is not None else None
    except ValueError:
        return None
