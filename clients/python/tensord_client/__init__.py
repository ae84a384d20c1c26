"""Python client for tensord: sync and asyncio, NumPy arrays in and out.

Replies come as typed records with the contract's enums by name (`Health.status` is
"SERVING", `GenerateChunk.finish_reason` "STOP" or "LENGTH"), each keeping its protobuf
message as `proto`; failed calls raise one TensordError subclass per status code.
"""

from tensord_client._common import DEFAULT_TARGET, TARGET_ENV, TLSOptions, predict_outputs
from tensord_client.aio import AsyncClient
from tensord_client.client import Client
from tensord_client.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TensordError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    retry_after,
)
from tensord_client.results import (
    DataType,
    FinishReason,
    GenerateChunk,
    Health,
    Info,
    ModelHealth,
    ModelIndex,
    ModelInfo,
    ModelState,
    ServingStatus,
    TensorSpec,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TARGET",
    "TARGET_ENV",
    "AsyncClient",
    "Cancelled",
    "Client",
    "DataType",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FinishReason",
    "GenerateChunk",
    "Health",
    "Info",
    "Internal",
    "InvalidArgument",
    "ModelHealth",
    "ModelIndex",
    "ModelInfo",
    "ModelState",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "ServingStatus",
    "TLSOptions",
    "TensorSpec",
    "TensordError",
    "TokenLogprob",
    "TopLogprob",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Usage",
    "predict_outputs",
    "retry_after",
]
