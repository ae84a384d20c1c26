"""Errors that carry their gRPC status, so every layer raises and one place maps them.

The mapping follows the error table in the README: each class names one situation.
"""

from __future__ import annotations

import grpc


class TensordError(Exception):
    """Base class: an error with the gRPC status a client should see."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFoundError(TensordError):
    """Unknown model or version."""

    code = grpc.StatusCode.NOT_FOUND


class InvalidArgumentError(TensordError):
    """Bad tensor name, dtype, shape or byte length; bad parameter."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class UnavailableError(TensordError):
    """Transient: a model version loading or unloading; the server starting or draining.
    Clients retry it (elsewhere, or shortly)."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhaustedError(TensordError):
    """Queue full, rate limit, message too large."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(TensordError):
    """The client's deadline passed while the request waited or ran."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED

    @classmethod
    def in_queue(cls, waited_s: float) -> DeadlineExceededError:
        """The deadline passed before the request started: it never ran."""
        return cls(
            f"the deadline passed after {waited_s * 1e3:.1f} ms in the queue; "
            "the request did not run"
        )

    @classmethod
    def queued_or_running(cls, waited_s: float) -> DeadlineExceededError:
        """The deadline passed while the request waited or ran; its answer was dropped."""
        return cls(
            f"the deadline passed after {waited_s * 1e3:.1f} ms while the request was "
            "queued or running"
        )


class FailedPreconditionError(TensordError):
    """An RPC the model cannot do (Generate on a model that is not a generator), or a model
    version that failed to load, until a reload fixes it. Clients do not retry it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class UnimplementedError(TensordError):
    """An RPC that is not built yet."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(TensordError):
    """A backend or device failure; logged with the request id, the daemon stays up."""

    code = grpc.StatusCode.INTERNAL


class DeviceLostError(InternalError):
    """A sticky device failure: the CUDA context is unusable until the process restarts.

    The request that met it fails INTERNAL; the server then turns health NOT_SERVING,
    drains and exits non-zero so that systemd starts a fresh process.
    """


class RateLimitedError(ResourceExhaustedError):
    """A caller went over its request rate; `retry_after_s` says when the next one fits,
    `subject` who went over (e.g. `token:alice`) and `quota` which rate, in words."""

    def __init__(
        self, message: str, retry_after_s: float, subject: str = "", quota: str = ""
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.subject = subject
        self.quota = quota


class UnauthenticatedError(TensordError):
    """No credentials, or credentials that match nothing."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(TensordError):
    """Valid credentials that do not allow this model."""

    code = grpc.StatusCode.PERMISSION_DENIED


class OutOfMemoryError(ResourceExhaustedError):
    """The device (or host) ran out of memory for a batch, even after splitting it."""


class ModelLoadError(Exception):
    """A model could not be loaded; the message is the reason shown in Health and Info."""


class ConfigError(Exception):
    """A configuration file or value is invalid; the message names the field."""
