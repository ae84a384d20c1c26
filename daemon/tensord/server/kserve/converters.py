"""The Open Inference Protocol's (KServe v2) metadata, configuration and statistics messages
from the data plane's model snapshots."""

from __future__ import annotations

from tensord.dataplane import IndexEntry, ModelSnapshot, ModelState, TensorSpec
from tensord.errors import NotFoundError
from tensord.kserve.v2 import grpc_service_pb2 as pb
from tensord.kserve.v2 import model_config_pb2 as mc
from tensord.server.kserve.codec import DATATYPES

PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}
"""Triton's platform names for tensord's backends."""


_TRITON_STATES = {
    ModelState.LOADING: "LOADING",
    ModelState.READY: "READY",
    ModelState.FAILED: "UNAVAILABLE",
    ModelState.UNLOADING: "UNLOADING",
}
"""Triton's repository index states; a model not loaded is UNAVAILABLE too."""


def repository_index_response(index: list[IndexEntry]) -> pb.RepositoryIndexResponse:
    """Triton's repository index: versions as strings ("" for a model not loaded)."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=e.name,
                version=str(e.version) if e.version else "",
                state="UNAVAILABLE" if e.state is None else _TRITON_STATES[e.state],
                reason=e.reason,
            )
            for e in index
        ]
    )


def pick(snapshots: list[ModelSnapshot], version: int) -> ModelSnapshot:
    """The version a metadata call describes: the one asked for (NOT_FOUND if absent), else
    the newest READY one, else the newest."""
    if version:
        for snapshot in snapshots:
            if snapshot.version == version:
                return snapshot
        have = ", ".join(str(s.version) for s in snapshots)
        name = snapshots[0].name if snapshots else "?"
        raise NotFoundError(f"model {name!r} has no version {version}; versions: {have}")
    ready = [s for s in snapshots if s.state is ModelState.READY]
    return max(ready or snapshots, key=lambda s: s.version)


def _metadata_shape(spec: TensorSpec) -> list[int]:
    return list(spec.shape) if spec.rank_known else [-1]


def metadata_response(
    snapshots: list[ModelSnapshot], chosen: ModelSnapshot
) -> pb.ModelMetadataResponse:
    """ModelMetadata: the model's versions, platform, and the chosen version's signature
    (shapes include the batch dimension, -1 where dynamic)."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=chosen.name,
        versions=[str(s.version) for s in snapshots],
        platform=PLATFORMS.get(chosen.backend, chosen.backend),
        inputs=[
            tensor(name=s.name, datatype=DATATYPES[s.dtype], shape=_metadata_shape(s))
            for s in chosen.inputs
        ],
        outputs=[
            tensor(name=s.name, datatype=DATATYPES[s.dtype], shape=_metadata_shape(s))
            for s in chosen.outputs
        ],
    )


def _data_type(spec: TensorSpec) -> mc.DataType:
    name = DATATYPES[spec.dtype]
    return mc.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    """Triton's dims leave out the batch dimension when the model batches."""
    if not spec.rank_known:
        return [-1]
    return list(spec.shape[1:] if batched and spec.shape else spec.shape)


def config_response(m: ModelSnapshot) -> pb.ModelConfigResponse:
    """ModelConfig: what clients such as perf_analyzer read (platform, batching, the
    signature, instances)."""
    batched = m.max_batch_size > 0
    config = mc.ModelConfig(
        name=m.name,
        platform=PLATFORMS.get(m.backend, m.backend),
        backend=m.backend,
        max_batch_size=m.max_batch_size,
        input=[
            mc.ModelInput(name=s.name, data_type=_data_type(s), dims=_dims(s, batched))
            for s in m.inputs
        ],
        output=[
            mc.ModelOutput(name=s.name, data_type=_data_type(s), dims=_dims(s, batched))
            for s in m.outputs
        ],
    )
    config.version_policy.specific.versions.append(m.version)
    if m.instance_count:
        kind = (
            mc.ModelInstanceGroup.KIND_GPU
            if m.executor == "cuda"
            else mc.ModelInstanceGroup.KIND_CPU
        )
        config.instance_group.add(name=m.name, count=m.instance_count, kind=kind)
    b = m.dynamic_batching
    if b is not None:
        batching = config.dynamic_batching
        batching.preferred_batch_size.extend(b.preferred_batch_size)
        batching.max_queue_delay_microseconds = b.max_queue_delay_microseconds
        policy = batching.default_queue_policy
        policy.max_queue_size = b.max_queue_size
        policy.default_timeout_microseconds = b.default_timeout_microseconds
    return pb.ModelConfigResponse(config=config)


def model_statistics(m: ModelSnapshot) -> pb.ModelStatistics:
    """What tensord counts of a version, as Triton counts it: per request, successes and
    failures with their whole time, and the succeeded ones' queue and compute time
    (compute_input and compute_output are inside compute_infer: tensord does not time them
    apart, so they count requests with no time); inferences (rows) and runs
    (execution_count); the rest stays zero."""
    stats = pb.ModelStatistics(name=m.name, version=str(m.version))
    if m.executor_status is not None:
        stats.execution_count = sum(lane.runs for lane in m.executor_status.stats.lanes)
    r = m.requests
    if r is not None:
        infer = stats.inference_stats
        for duration, count, seconds in (
            (infer.success, r.succeeded, r.succeeded_s),
            (infer.fail, r.failed, r.failed_s),
            (infer.queue, r.succeeded, r.queue_s),
            (infer.compute_infer, r.succeeded, r.compute_s),
            # Counted, with no time of their own: perf_analyzer needs the three counts equal.
            (infer.compute_input, r.succeeded, 0.0),
            (infer.compute_output, r.succeeded, 0.0),
        ):
            duration.count = count
            duration.ns = int(seconds * 1e9)
        stats.inference_count = r.rows
        stats.last_inference = r.last_ms
    return stats
