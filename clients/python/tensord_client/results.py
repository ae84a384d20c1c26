"""What the clients return: the contract's enums by name, and replies as typed records.

Each record keeps the protobuf message it was read from as `proto`, for fields a newer
daemon sends that this client does not know yet, or for `json_format`. Sub-messages that
carry no enum (GPU, runtime, batching, generator status, ...) are the protobuf messages
themselves, read as protobuf reads them: a sub-message the daemon did not set reads as
zeros (`model.proto.HasField("generator")` tells).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Self

import numpy as np
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from tensord_client.dtypes import DType
from tensord_client.v1 import inference_pb2 as pb


class WireEnum(enum.StrEnum):
    """A protobuf enum value by its name, less the enum's prefix: "SERVING" for
    SERVING_STATUS_SERVING, "STOP" for FINISH_REASON_STOP.

    It is a str and equals its name. It also equals its wire number (`number`), so code
    written against the generated constants (`== pb.SERVING_STATUS_SERVING`) keeps working;
    as a dict key it is its name. A number this client does not know (from a newer daemon)
    reads as UNSPECIFIED; the record's `proto` keeps the number.
    """

    @classmethod
    def _wire(cls) -> tuple[EnumTypeWrapper, str]:
        return _WIRE[cls]

    @property
    def number(self) -> int:
        """The enum value's number on the wire."""
        proto, prefix = self._wire()
        return int(proto.Value(prefix + self.value))

    @classmethod
    def from_number(cls, number: int) -> Self:
        """The member for a wire number; UNSPECIFIED for one this client does not know."""
        proto, prefix = cls._wire()
        try:
            return cls(proto.Name(number).removeprefix(prefix))
        except ValueError:
            return cls("UNSPECIFIED")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return self.number == other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return str.__hash__(self)


class ServingStatus(WireEnum):
    """The server's readiness (Health.status)."""

    UNSPECIFIED = "UNSPECIFIED"
    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"


class ModelState(WireEnum):
    """Where a model version is in its life."""

    UNSPECIFIED = "UNSPECIFIED"
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    UNLOADING = "UNLOADING"
    NOT_LOADED = "NOT_LOADED"


class FinishReason(WireEnum):
    """Why a generation ended: a stop condition (end of sequence, a stop string or token),
    or max_tokens (or the model's context) reached."""

    UNSPECIFIED = "UNSPECIFIED"
    STOP = "STOP"
    LENGTH = "LENGTH"


class DataType(WireEnum):
    """A tensor's element type (TensorSpec.dtype); DType has its NumPy dtype."""

    UNSPECIFIED = "UNSPECIFIED"
    BOOL = "BOOL"
    UINT8 = "UINT8"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FLOAT16 = "FLOAT16"
    BFLOAT16 = "BFLOAT16"
    FLOAT32 = "FLOAT32"
    FLOAT64 = "FLOAT64"
    STRING = "STRING"


_WIRE: dict[type[WireEnum], tuple[EnumTypeWrapper, str]] = {
    ServingStatus: (pb.ServingStatus, "SERVING_STATUS_"),
    ModelState: (pb.ModelState, "MODEL_STATE_"),
    FinishReason: (pb.FinishReason, "FINISH_REASON_"),
    DataType: (pb.DataType, "DATA_TYPE_"),
}


@dataclass(slots=True, frozen=True)
class ModelHealth:
    """One model version's health."""

    name: str
    version: int
    state: ModelState
    reason: str
    """Why it is not READY (a failed load's error), else empty."""

    @classmethod
    def from_proto(cls, m: pb.ModelHealth) -> ModelHealth:
        return cls(m.name, m.version, ModelState.from_number(m.state), m.reason)


@dataclass(slots=True, frozen=True)
class ModelIndex:
    """One model version of the repository index (version 0: a model not loaded)."""

    name: str
    version: int
    state: ModelState
    reason: str

    @classmethod
    def from_proto(cls, m: pb.ModelIndex) -> ModelIndex:
        return cls(m.name, m.version, ModelState.from_number(m.state), m.reason)


@dataclass(slots=True, frozen=True)
class Health:
    """The server's readiness and each model version's state."""

    status: ServingStatus
    models: list[ModelHealth]
    proto: pb.HealthResponse = field(repr=False, compare=False)

    @property
    def serving(self) -> bool:
        """Whether the server is SERVING."""
        return self.status is ServingStatus.SERVING

    @classmethod
    def from_proto(cls, reply: pb.HealthResponse) -> Health:
        models = [ModelHealth.from_proto(m) for m in reply.models]
        return cls(ServingStatus.from_number(reply.status), models, reply)


@dataclass(slots=True, frozen=True)
class TopLogprob:
    """One of the most likely alternatives at a position."""

    token_id: int
    logprob: float


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log probability, and the top alternatives asked for."""

    token_id: int
    logprob: float
    top: list[TopLogprob]


@dataclass(slots=True, frozen=True)
class Usage:
    """Token counts and timings of a finished generation (on its last chunk)."""

    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_ms: float
    mean_inter_token_ms: float


@dataclass(slots=True, frozen=True)
class GenerateChunk:
    """A piece of a generation stream. `finish_reason` and `usage` are None until the last
    chunk."""

    index: int
    """The position of this chunk's first token among the generated ones."""
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]
    finish_reason: FinishReason | None
    usage: Usage | None
    proto: pb.GenerateResponse = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, c: pb.GenerateResponse) -> GenerateChunk:
        logprobs = [
            TokenLogprob(
                lp.token_id, lp.logprob, [TopLogprob(t.token_id, t.logprob) for t in lp.top]
            )
            for lp in c.logprobs
        ]
        u = c.usage
        usage = (
            Usage(
                u.prompt_tokens,
                u.completion_tokens,
                u.time_to_first_token_ms,
                u.mean_inter_token_ms,
            )
            if c.HasField("usage")
            else None
        )
        reason = FinishReason.from_number(c.finish_reason) if c.finish_reason else None
        return cls(c.index, list(c.token_ids), c.text, logprobs, reason, usage, c)


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """A model input or output: name, element type and shape (-1 for a free dimension)."""

    name: str
    dtype: DataType
    shape: list[int]
    unknown_rank: bool
    """The model does not say how many dimensions it takes (shape is then empty)."""

    @property
    def numpy_dtype(self) -> np.dtype | None:
        """The NumPy dtype of the elements (None for a type this client does not know)."""
        try:
            return DType(self.dtype.number).numpy
        except ValueError:
            return None

    @classmethod
    def from_proto(cls, s: pb.TensorSpec) -> TensorSpec:
        return cls(s.name, DataType.from_number(s.dtype), list(s.shape), s.unknown_rank)


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """What Info says of one model version (see the contract's ModelInfo for each field)."""

    name: str
    version: int
    state: ModelState
    reason: str
    backend: str
    provider: str
    provider_reason: str
    requested_providers: list[str]
    executor: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    load_time_ms: float
    kind: str
    instance_count: int
    dynamic_batching: pb.DynamicBatching
    executor_status: pb.ExecutorStatus
    preprocess: pb.ProcessingStep
    postprocess: pb.ProcessingStep
    generator: pb.GeneratorStatus
    embedding: pb.EmbeddingStatus
    proto: pb.ModelInfo = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, m: pb.ModelInfo) -> ModelInfo:
        return cls(
            name=m.name,
            version=m.version,
            state=ModelState.from_number(m.state),
            reason=m.reason,
            backend=m.backend,
            provider=m.provider,
            provider_reason=m.provider_reason,
            requested_providers=list(m.requested_providers),
            executor=m.executor,
            inputs=[TensorSpec.from_proto(s) for s in m.inputs],
            outputs=[TensorSpec.from_proto(s) for s in m.outputs],
            max_batch_size=m.max_batch_size,
            load_time_ms=m.load_time_ms,
            kind=m.kind,
            instance_count=m.instance_count,
            dynamic_batching=m.dynamic_batching,
            executor_status=m.executor_status,
            preprocess=m.preprocess,
            postprocess=m.postprocess,
            generator=m.generator,
            embedding=m.embedding,
            proto=m,
        )


@dataclass(slots=True, frozen=True)
class Info:
    """The server: version, runtimes, devices, providers and models."""

    server_version: str
    runtime: pb.RuntimeVersions
    cpu: pb.CpuInfo
    gpus: list[pb.GpuInfo]
    gpu_unavailable_reason: str
    available_providers: list[str]
    models: list[ModelInfo]
    cuda_driver_version: str
    cuda_runtime_version: str
    tensorrt: str
    endpoints: list[tuple[str, str]]
    """(protocol, address) of each protocol the server speaks."""
    proto: pb.InfoResponse = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, r: pb.InfoResponse) -> Info:
        return cls(
            server_version=r.server_version,
            runtime=r.runtime,
            cpu=r.cpu,
            gpus=list(r.gpus),
            gpu_unavailable_reason=r.gpu_unavailable_reason,
            available_providers=list(r.available_providers),
            models=[ModelInfo.from_proto(m) for m in r.models],
            cuda_driver_version=r.cuda_driver_version,
            cuda_runtime_version=r.cuda_runtime_version,
            tensorrt=r.tensorrt,
            endpoints=[(e.protocol, e.address) for e in r.endpoints],
            proto=r,
        )
