"""Protobuf to the data plane's types and back. No logic beyond the mapping lives here."""

from __future__ import annotations

import json
import time
from typing import cast

from tensord.dataplane import (
    BatchingSnapshot,
    Constraint,
    EmbedCall,
    EmbedResult,
    ExecutorStats,
    GenerateCall,
    GeneratorSnapshot,
    HealthReport,
    IndexEntry,
    KVCacheStats,
    ModelSnapshot,
    ModelState,
    PredictCall,
    PredictResult,
    ProcessingReport,
    RequestOutput,
    SamplingParams,
    ServerInfo,
    TensorSpec,
)
from tensord.errors import InvalidArgumentError
from tensord.server.tensord_v1.codec import decode_tensor, fill_tensor, pb_dtype
from tensord.v1 import inference_pb2 as pb


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


def embed_call(
    request: pb.EmbedRequest, time_remaining: float | None, most_ids: int = 0
) -> EmbedCall:
    """Decode an EmbedRequest (truncation on unless `truncate` is set false); token-id
    inputs keep at most `most_ids` ids each (0: all), which is all a check needs."""
    deadline = None if time_remaining is None else time.monotonic() + time_remaining
    return EmbedCall(
        request.model,
        request.version,
        list(request.texts),
        [list(t.ids[:most_ids] if most_ids else t.ids) for t in request.token_ids],
        truncate=request.truncate if request.HasField("truncate") else True,
        dimensions=request.dimensions,
        deadline=deadline,
    )


def embed_response(result: EmbedResult, total_us: int) -> pb.EmbedResponse:
    """Encode an EmbedResult: one Embedding a vector."""
    response = pb.EmbedResponse(
        model=result.model, version=result.version, prompt_tokens=result.prompt_tokens
    )
    embeddings = response.embeddings
    for vector in result.vectors:  # row by row: the loop thread gets its turns
        embeddings.add().values.extend(vector.tolist())
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
        constraint=_constraint(s.constraint) if given("constraint") else None,
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
        priority=request.priority,
    )


def _constraint(c: pb.Constraint) -> Constraint:
    """A request's constraint; INVALID_ARGUMENT when none of its kinds is set."""
    kind = c.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not c.json_object):
        raise InvalidArgumentError(
            "sampling.constraint has no kind set: set one of json_schema, json_object (true), "
            "regex, choice or grammar"
        )
    if kind == "json_object":
        return Constraint(kind)
    if kind == "choice":
        return Constraint(kind, json.dumps(list(c.choice.choices), ensure_ascii=False))
    return Constraint(kind, getattr(c, kind))


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


def _blocks(
    stats: KVCacheStats | None, block_bytes: int, total_bytes: int | None = None
) -> pb.KvCacheStatus | None:
    """A block pool's state (None: there is none); its bytes, blocks x block_bytes unless
    given."""
    if stats is None:
        return None
    return pb.KvCacheStatus(
        block_size=stats.block_size,
        total_blocks=stats.total_blocks,
        used_blocks=stats.used_blocks,
        free_blocks=stats.free_blocks,
        cached_blocks=stats.cached_blocks,
        utilization=stats.utilisation,
        block_bytes=block_bytes,
        total_bytes=block_bytes * stats.total_blocks if total_bytes is None else total_bytes,
    )


def generator_status(g: GeneratorSnapshot) -> pb.GeneratorStatus:
    """Encode a generator's limits and its engine's state for Info."""
    stats = g.stats
    kv = stats.kv_cache
    return pb.GeneratorStatus(
        max_model_len=g.max_model_len,
        max_num_seqs=g.max_num_seqs,
        max_num_batched_tokens=g.max_num_batched_tokens,
        max_queue_size=g.max_queue_size,
        running=stats.running,
        waiting=stats.waiting,
        kv_cache=_blocks(kv, g.block_bytes, g.total_bytes),
        steps=stats.steps,
        generated_tokens=stats.generated_tokens,
        prefix_hit_tokens=stats.prefix_hit_tokens,
        preemptions=stats.preemptions,
        eos_token_ids=g.eos_token_ids,
        stream_interval=g.stream_interval,
        batch_layout=g.batch_layout,
        batch_layout_reason=g.batch_layout_reason,
        model_passes=stats.passes.passes,
        pass_sequences=stats.passes.sequences,
        max_pass_sequences=stats.passes.max_sequences,
        kv_path=g.kv_path,
        kv_path_reason=g.kv_path_reason,
        slot_bytes=g.slot_bytes,
        slot_moves=stats.slot_moves,
        step_seconds=stats.step_seconds,
        model_seconds=stats.passes.run_seconds,
        prefix_query_tokens=stats.prefix_query_tokens,
        prefix_store=_blocks(stats.prefix_store, g.prefix_block_bytes),
        prefix_bytes_loaded=stats.prefix_bytes_loaded,
        prefix_bytes_saved=stats.prefix_bytes_saved,
        constraints=list(g.constraints),
    )


def health_response(report: HealthReport) -> pb.HealthResponse:
    """Encode a HealthReport."""
    status = pb.SERVING_STATUS_SERVING if report.serving else pb.SERVING_STATUS_NOT_SERVING
    return pb.HealthResponse(
        status=status,
        models=[
            pb.ModelHealth(name=m.name, version=m.version, state=_state(m.state), reason=m.reason)
            for m in report.models
        ],
    )


def index_response(index: list[IndexEntry]) -> pb.RepositoryIndexResponse:
    """The repository index: each loaded version's state, NOT_LOADED for the others."""
    response = pb.RepositoryIndexResponse()
    for e in index:
        state = pb.MODEL_STATE_NOT_LOADED if e.state is None else _state(e.state)
        response.models.add(name=e.name, version=e.version, state=state, reason=e.reason)
    return response


def _state(state: ModelState) -> pb.ModelState:
    return cast(pb.ModelState, int(state))


def _spec(spec: TensorSpec) -> pb.TensorSpec:
    return pb.TensorSpec(
        name=spec.name,
        dtype=pb_dtype(spec.dtype),
        shape=spec.shape,
        unknown_rank=not spec.rank_known,
    )


def _step(report: ProcessingReport) -> pb.ProcessingStep:
    return pb.ProcessingStep(
        kind=report.kind,
        device=report.device,
        description=report.description,
        reason=report.reason,
    )


def model_info(m: ModelSnapshot) -> pb.ModelInfo:
    """Encode one model version for Info."""
    info = pb.ModelInfo(
        name=m.name,
        version=m.version,
        state=_state(m.state),
        reason=m.reason,
        backend=m.backend,
        inputs=[_spec(s) for s in m.inputs],
        outputs=[_spec(s) for s in m.outputs],
        max_batch_size=m.max_batch_size,
        load_time_ms=m.load_time_s * 1e3,
        kind=m.kind,
        instance_count=m.instance_count,
        provider=m.provider,
        provider_reason=m.provider_reason,
        requested_providers=m.requested_providers,
        executor=m.executor,
    )
    if m.executor_status is not None:
        info.executor_status.CopyFrom(
            executor_status(m.executor_status.stats, m.executor_status.reason)
        )
    if m.generator is not None:
        info.generator.CopyFrom(generator_status(m.generator))
    if m.embedding is not None:
        e = m.embedding
        info.embedding.CopyFrom(
            pb.EmbeddingStatus(
                max_seq_length=e.max_seq_length,
                dimensions=e.dimensions,
                pooling=e.pooling,
                normalized=e.normalized,
                max_batch_tokens=e.max_batch_tokens,
            )
        )
    if m.preprocess is not None:
        info.preprocess.CopyFrom(_step(m.preprocess))
    if m.postprocess is not None:
        info.postprocess.CopyFrom(_step(m.postprocess))
    if m.dynamic_batching is not None:
        info.dynamic_batching.CopyFrom(_batching(m.dynamic_batching))
    return info


def _batching(b: BatchingSnapshot) -> pb.DynamicBatching:
    batching = pb.DynamicBatching(
        preferred_batch_size=b.preferred_batch_size,
        max_queue_delay_microseconds=b.max_queue_delay_microseconds,
        max_queue_size=b.max_queue_size,
        default_timeout_microseconds=b.default_timeout_microseconds,
    )
    if b.served:
        batching.batches, batching.requests, batching.rows = b.batches, b.requests, b.rows
        batching.expired, batching.rejected = b.expired, b.rejected
        batching.queue_depth, batching.concurrent_batches = b.queue_depth, b.concurrent_batches
    return batching


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
        models=[model_info(m) for m in info.models],
    )
