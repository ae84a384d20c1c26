"""The Open Inference Protocol (KServe v2) gRPC service, `inference.GRPCInferenceService`,
as Triton and KServe define it: a facade over the same data plane as tensord.v1.

Its calls go through the same RPC decorators (intake, authorization, request ids,
metrics, logs, one failure path), so a ModelInfer is validated, queued, batched, limited
and counted as a Predict is. Protocol messages are converted in codec.py and
converters.py beside it. The repository RPCs (Triton's model-control extension) load and
unload models with [server] model_control = "explicit". The streaming extension
(ModelStreamInfer), the shared-memory, trace and log RPCs are not registered: gRPC answers
UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc
import structlog

from tensord import __version__
from tensord.access import check_model
from tensord.dataplane import (
    PREDICT,
    DataPlane,
    ModelState,
    PredictCall,
    PredictResult,
    WrongKindError,
)
from tensord.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from tensord.kserve.v2 import grpc_service_pb2 as pb
from tensord.observability.observer import RequestObserver
from tensord.server.kit.intake import Intake
from tensord.server.kit.look import Look
from tensord.server.kit.rpc import CallsInFlight, Ctx, unary_rpc
from tensord.server.kit.service import predict_finished, register_raw
from tensord.server.kit.tensors import INLINE_STEPS, plan_reply
from tensord.server.kserve.codec import decode_cost, decode_inputs, fill_outputs
from tensord.server.kserve.converters import (
    config_response,
    metadata_response,
    model_statistics,
    pick,
    repository_index_response,
)
from tensord.server.kserve.intake import LOOKERS, parse_version

log = structlog.get_logger("tensord.request")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
METHODS = frozenset(LOOKERS)
"""The RPCs served; the others are not registered (UNIMPLEMENTED)."""
EXTENSIONS = ("model_configuration", "model_repository", "statistics")
"""The protocol extensions ServerMetadata reports."""
_SEQUENCE_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end"})


class KServeServicer:
    """Implements inference.GRPCInferenceService over a DataPlane, sharing the tensord.v1
    servicer's intake (limits, in-flight budget, drain) and its calls in flight."""

    def __init__(
        self,
        dataplane: DataPlane,
        intake: Intake,
        calls: CallsInFlight,
        observer: RequestObserver | None = None,
        max_send_message_bytes: int = 0,
    ) -> None:
        self._dataplane = dataplane
        self.intake = intake
        intake.lookers.update(LOOKERS)
        self.calls = calls
        self.observer = observer
        self.max_send_message_bytes = max_send_message_bytes

    def check_model(self, rpc: str, model: str) -> None:
        """As soon as a request's model name is read: the caller may use it."""
        if rpc.startswith("Model") and model:
            check_model(model)

    def check_look(self, rpc: str, look: Look) -> None:
        """Nothing beyond the intake's bounds."""

    def admitted(self, rpc: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    @unary_rpc(pb.ServerLiveRequest)
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @unary_rpc(pb.ServerReadyRequest)
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.readiness().ready)

    @unary_rpc(pb.ModelReadyRequest)
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ModelReadyResponse:
        version = parse_version(request.version)
        try:
            report = self._dataplane.health(_named(request.name))
        except NotFoundError:
            return pb.ModelReadyResponse(ready=False)
        ready = report.serving and any(
            m.state is ModelState.READY and version in (0, m.version) for m in report.models
        )
        return pb.ModelReadyResponse(ready=ready)

    @unary_rpc(pb.ServerMetadataRequest)
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="tensord", version=__version__, extensions=EXTENSIONS)

    @unary_rpc(pb.RepositoryIndexRequest)
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Ctx, rid: str, target: Any
    ) -> pb.RepositoryIndexResponse:
        _one_repository(request.repository_name)
        index = await self._dataplane.control.index(ready_only=request.ready)
        return repository_index_response(index)

    @unary_rpc(pb.RepositoryModelLoadRequest)
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Ctx, rid: str, target: Any
    ) -> pb.RepositoryModelLoadResponse:
        _one_repository(request.repository_name)
        for key in request.parameters:  # tritonclient's config and file: overrides
            raise InvalidArgumentError(
                f"parameters[{key[:64]!r}]: a load takes the model's files and model.toml from "
                "the repository as they are; load parameters are not taken"
            )
        await self._dataplane.control.load(_named(request.model_name))
        return pb.RepositoryModelLoadResponse()

    @unary_rpc(pb.RepositoryModelUnloadRequest)
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Ctx, rid: str, target: Any
    ) -> pb.RepositoryModelUnloadResponse:
        _one_repository(request.repository_name)
        for key in request.parameters:
            if key != "unload_dependents":  # a model has no dependents here: nothing to do
                raise InvalidArgumentError(f"parameters[{key[:64]!r}] is not taken by an unload")
        await self._dataplane.control.unload(_named(request.model_name))
        return pb.RepositoryModelUnloadResponse()

    @unary_rpc(pb.ModelMetadataRequest)
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ModelMetadataResponse:
        snapshots = await self._dataplane.model_snapshots(_named(request.name))
        return metadata_response(snapshots, pick(snapshots, parse_version(request.version)))

    @unary_rpc(pb.ModelConfigRequest)
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ModelConfigResponse:
        snapshots = await self._dataplane.model_snapshots(_named(request.name))
        return config_response(pick(snapshots, parse_version(request.version)))

    @unary_rpc(pb.ModelStatisticsRequest)
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ModelStatisticsResponse:
        version = parse_version(request.version)
        snapshots = await self._dataplane.model_snapshots(request.name)
        if version:
            snapshots = [pick(snapshots, version)]
        return pb.ModelStatisticsResponse(model_stats=[model_statistics(m) for m in snapshots])

    @unary_rpc(pb.ModelInferRequest)
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Ctx, rid: str, target: Any
    ) -> pb.ModelInferResponse:
        start = time.perf_counter()
        call = infer_call(request, context.time_remaining())
        if decode_cost(request) > INLINE_STEPS:
            call.inputs = await asyncio.to_thread(decode_inputs, request)
        else:
            call.inputs = decode_inputs(request)
        result = await self._predict(call)
        offload = plan_reply(
            result.outputs,
            contents=False,
            limit=self.max_send_message_bytes,
            form="",
            hint="ask for fewer outputs, or send a smaller batch",
        )
        predict_finished(self.observer, "ModelInfer", rid, result, start)
        response = pb.ModelInferResponse(
            model_name=result.model, model_version=str(result.version), id=request.id
        )
        if offload:
            await asyncio.to_thread(fill_outputs, response, result.outputs)
        else:
            fill_outputs(response, result.outputs)
        return response

    async def _predict(self, call: PredictCall) -> PredictResult:
        """The data plane's Predict (the caller was authorised as its model name was
        read), worded for this protocol where a generator is named."""
        try:
            entry = self._dataplane.lookup(call.model, call.version, PREDICT, authorised=True)
        except WrongKindError:
            raise FailedPreconditionError(
                f"model {call.model!r} is a generator: ModelInfer runs predict models "
                "(tensors in, tensors out); stream its tokens with tensord.v1's Generate"
            ) from None
        return await self._dataplane.predict(call, entry)


def _one_repository(name: str) -> None:
    """The daemon serves one model repository: a request naming another is refused."""
    if name:
        raise InvalidArgumentError(
            f"repository_name {name[:64]!r}: this server has one model repository; leave "
            "repository_name empty"
        )


def _named(name: str) -> str:
    """A model request's name: required (an empty one would mean every model)."""
    if not name:
        raise InvalidArgumentError("name is empty; give the model's name")
    return name


def infer_call(request: pb.ModelInferRequest, time_remaining: float | None) -> PredictCall:
    """The PredictCall a ModelInferRequest makes, its inputs not yet decoded; its
    parameters checked (sequence ones refused, `timeout` in microseconds shortening the
    deadline, the rest ignored), and its requested outputs' too."""
    deadline = None if time_remaining is None else time.monotonic() + time_remaining
    for key, value in request.parameters.items():
        if key in _SEQUENCE_PARAMETERS:
            raise InvalidArgumentError(
                f"parameter {key!r}: tensord's models are not sequence models; leave the "
                "sequence parameters out"
            )
        timeout = value.int64_param if key == "timeout" else 0
        if timeout > 0:
            ours = time.monotonic() + timeout / 1e6
            deadline = ours if deadline is None else min(deadline, ours)
    names = []
    for i, output in enumerate(request.outputs):
        for key in output.parameters:
            if key == "classification" or key.startswith("shared_memory"):
                raise InvalidArgumentError(
                    f"outputs[{i}] {output.name!r}: parameter {key!r} is not supported; ask "
                    "for the output by name alone"
                )
        names.append(output.name)
    version = parse_version(request.model_version)
    return PredictCall(request.model_name, version, [], names, deadline)


def add_kserve_servicer(servicer: KServeServicer, server: grpc.aio.Server) -> None:
    """Register the served RPCs of GRPCInferenceService (the others answer UNIMPLEMENTED)."""
    register_raw(servicer, server, pb, "GRPCInferenceService", METHODS)
