"""Protobuf to domain types and back. No logic beyond the mapping lives here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from tensord.backends.base import TensorSpec
from tensord.dataplane import GenerateCall, HealthReport, PredictCall, PredictResult, ServerInfo
from tensord.executor.base import ExecutorStats
from tensord.generate.core.outputs import RequestOutput
from tensord.generate.core.sampling_params import SamplingParams
from tensord.registry.version import GeneratorVersion, ModelVersion, PredictVersion
from tensord.server.codec import decode_tensor, fill_tensor, pb_dtype
from tensord.v1 import inference_pb2 as pb

if TYPE_CHECKING:
    from tensord.generate.engine.engine import EngineStats, GenerationEngine


def predict_call(request: pb.PredictRequest, time_remaining: float | None) -> PredictCall:
    """Decode a PredictRequest; `time_remaining` is the client's deadline in seconds."""
    inputs = [decode_tensor(t, f"inputs[{i}]") for i, t in enumerate(request.inputs)]
    deadline = None if time_remaining is None else time.monotonic() + time_remaining
    return PredictCall(request.model, request.version, inputs, list(request.output_names), deadline)


def predict_response(result: PredictResult, contents: bool, total_us: int) -> pb.PredictResponse:
    """Encode a PredictResult: raw bytes, or typed contents when `contents` (the request
    asked for TENSOR_ENCODING_CONTENTS)."""
    response = pb.PredictResponse(model=result.model, version=result.version)
    outputs = response.outputs
    for name, array in result.outputs:
        # Filled in place: a Tensor built apart and passed in would be copied once more.
        fill_tensor(outputs.add(), name, array, contents=contents)
    timing = response.timing
    timing.queue_us = int(result.queue_s * 1e6)
    timing.compute_us = int(result.compute_s * 1e6)
    timing.total_us = total_us
    return response


def generate_call(request: pb.GenerateRequest, time_remaining: float | None) -> GenerateCall:
    """Decode a GenerateRequest; absent optional sampling fields stay None (model default)."""
    s = request.sampling

    def given(field: str) -> bool:
        return request.HasField("sampling") and s.HasField(field)

    params = SamplingParams(
        max_tokens=s.max_tokens if given("max_tokens") else None,
        temperature=s.temperature if given("temperature") else None,
        top_k=s.top_k if given("top_k") else None,
        top_p=s.top_p if given("top_p") else None,
        repetition_penalty=s.repetition_penalty if given("repetition_penalty") else None,
        seed=s.seed if given("seed") else None,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        logprobs=s.logprobs,
    )
    now = time.monotonic()
    deadline = None if time_remaining is None else now + time_remaining
    return GenerateCall(
        request.model,
        request.version,
        request.prompt,
        list(request.prompt_token_ids),
        params,
        deadline,
        arrival=now,
    )


_FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}


def generate_response(chunk: RequestOutput) -> pb.GenerateResponse:
    """Encode one stream chunk; the last one carries the finish reason and usage."""
    response = pb.GenerateResponse(index=chunk.index, token_ids=chunk.token_ids, text=chunk.text)
    if chunk.logprobs:
        response.logprobs.extend(
            pb.TokenLogprob(
                token_id=lp.token_id,
                logprob=lp.logprob,
                top=[pb.TopLogprob(token_id=t, logprob=p) for t, p in lp.top],
            )
            for lp in chunk.logprobs
        )
    if chunk.finish_reason is not None:
        response.finish_reason = _FINISH_REASONS[chunk.finish_reason]
    if chunk.usage is not None:
        u = chunk.usage
        response.usage.CopyFrom(
            pb.Usage(
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                time_to_first_token_ms=u.time_to_first_token_ms,
                mean_inter_token_ms=u.mean_inter_token_ms,
            )
        )
    return response


def generator_status(engine: GenerationEngine, stats: EngineStats) -> pb.GeneratorStatus:
    """Encode a generation engine's limits and state for Info."""
    limits, kv = engine.limits, stats.kv_cache
    return pb.GeneratorStatus(
        max_model_len=limits.max_model_len,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_queue_size=limits.max_queue_size,
        running=stats.running,
        waiting=stats.waiting,
        kv_cache=pb.KvCacheStatus(
            block_size=kv.block_size,
            total_blocks=kv.total_blocks,
            used_blocks=kv.used_blocks,
            free_blocks=kv.free_blocks,
            cached_blocks=kv.cached_blocks,
            utilization=kv.utilisation,
            block_bytes=limits.block_bytes,
            total_bytes=engine.storage.nbytes,
        ),
        steps=stats.steps,
        generated_tokens=stats.generated_tokens,
        prefix_hit_tokens=stats.prefix_hit_tokens,
        preemptions=stats.preemptions,
        eos_token_ids=list(engine.directory.spec.eos_token_ids),
        stream_interval=limits.stream_interval,
        batch_layout=engine.layout.layout.value,
        batch_layout_reason=engine.layout.reason,
        model_passes=stats.passes.passes,
        pass_sequences=stats.passes.sequences,
        max_pass_sequences=stats.passes.max_sequences,
    )


def health_response(report: HealthReport) -> pb.HealthResponse:
    """Encode a HealthReport."""
    status = pb.SERVING_STATUS_SERVING if report.serving else pb.SERVING_STATUS_NOT_SERVING
    return pb.HealthResponse(
        status=status,
        models=[
            pb.ModelHealth(
                name=mv.name, version=mv.version, state=_state(mv), reason=report.redact(mv.reason)
            )
            for mv in report.models
        ],
    )


def _state(mv: ModelVersion) -> pb.ModelState:
    return cast(pb.ModelState, int(mv.state))


def _spec(spec: TensorSpec) -> pb.TensorSpec:
    return pb.TensorSpec(
        name=spec.name,
        dtype=pb_dtype(spec.dtype),
        shape=spec.shape,
        unknown_rank=not spec.rank_known,
    )


def model_info(mv: ModelVersion, redact: Callable[[str], str] = str) -> pb.ModelInfo:
    """Encode one model version for Info; `redact` is what its failure reason may show."""
    info = pb.ModelInfo(
        name=mv.name,
        version=mv.version,
        state=_state(mv),
        reason=redact(mv.reason),
        backend=mv.config.backend,
        inputs=[_spec(s) for s in mv.inputs],
        outputs=[_spec(s) for s in mv.outputs],
        max_batch_size=mv.config.max_batch_size,
        load_time_ms=mv.load_time_s * 1e3,
        kind=mv.kind,
        instance_count=_instances(mv),
    )
    if mv.placement is not None:
        info.provider = mv.placement.provider
        info.provider_reason = mv.placement.provider_reason
        info.requested_providers.extend(mv.placement.requested_providers)
    match mv:
        case PredictVersion():
            _predict_info(info, mv)
        case GeneratorVersion():
            if mv.engine is not None:
                info.executor = "cpu"  # the engine's steps run on the host (model_runner.py)
                info.generator.CopyFrom(generator_status(mv.engine, mv.engine.stats()))
    return info


def _predict_info(info: pb.ModelInfo, mv: PredictVersion) -> None:
    """What Info shows of a predict model beyond what every version has."""
    if mv.executor is not None:
        info.executor = mv.executor.kind
        info.executor_status.CopyFrom(executor_status(mv.executor.stats(), mv.executor.reason))
    for report in mv.processing:
        step = info.postprocess if report.kind in ("topk", "nms") else info.preprocess
        step.CopyFrom(
            pb.ProcessingStep(
                kind=report.kind,
                device=report.device,
                description=report.description,
                reason=report.reason,
            )
        )
    batching = mv.config.dynamic_batching
    if batching is not None:
        info.dynamic_batching.CopyFrom(
            pb.DynamicBatching(
                preferred_batch_size=batching.preferred_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                max_queue_size=batching.max_queue_size,
                default_timeout_microseconds=batching.default_timeout_microseconds,
            )
        )
        if mv.batcher is not None:
            s = mv.batcher.stats
            d = info.dynamic_batching
            d.batches, d.requests, d.rows = s.batches, s.requests, s.rows
            d.expired, d.rejected, d.queue_depth = s.expired, s.rejected, mv.batcher.queue_depth
            d.concurrent_batches = mv.batcher.settings.instances


def _instances(mv: ModelVersion) -> int:
    """Runs that may execute at once, as served (not only as model.toml says)."""
    match mv:
        case GeneratorVersion():
            return 1  # the engine runs one step at a time, whatever model.toml's default says
        case PredictVersion(executor=executor) if executor is not None:
            return mv.config.instances_on(executor.kind)
    return mv.config.instance_count


def executor_status(stats: ExecutorStats, reason: str) -> pb.ExecutorStatus:
    """Encode an executor snapshot."""
    return pb.ExecutorStatus(
        kind=stats.kind,
        reason=reason,
        lanes=[
            pb.LaneStatus(index=i, runs=lane.runs, failed=lane.failed, busy_seconds=lane.busy_s)
            for i, lane in enumerate(stats.lanes)
        ],
        queue_depth=stats.queue_depth,
        running=stats.running,
        pools=[
            pb.PoolStatus(
                name=name,
                in_use_bytes=p.in_use_bytes,
                cached_bytes=p.cached_bytes,
                high_water_bytes=p.high_water_bytes,
                allocations=p.allocations,
                reuses=p.reuses,
            )
            for name, p in stats.pools.items()
        ],
    )


def info_response(info: ServerInfo) -> pb.InfoResponse:
    """Encode ServerInfo."""
    return pb.InfoResponse(
        server_version=info.version,
        runtime=pb.RuntimeVersions(**info.runtime),
        cpu=pb.CpuInfo(
            model=info.cpu.model,
            architecture=info.cpu.architecture,
            logical_cores=info.cpu.logical_cores,
        ),
        gpus=[
            pb.GpuInfo(
                index=g.index,
                name=g.name,
                total_memory_bytes=g.total_memory_bytes,
                compute_capability=g.compute_capability,
            )
            for g in info.gpu.gpus
        ],
        gpu_unavailable_reason=info.gpu.unavailable_reason,
        cuda_driver_version=info.gpu.driver_version,
        cuda_runtime_version=info.gpu.runtime_version,
        available_providers=info.available_providers,
        tensorrt=info.tensorrt,
        models=[model_info(mv, info.redact) for mv in info.models],
    )
