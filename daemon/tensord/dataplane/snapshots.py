"""Snapshots of served model versions for Health and Info: what a transport shows of them.

The domain rules of what is shown live here, not in a transport's converters: which
processing steps count as postprocessing, which executor a generator reports, how many
runs of a model may execute at once.
"""

from __future__ import annotations

import dataclasses

from tensord.dataplane.types import (
    BatchingSnapshot,
    EmbeddingSnapshot,
    ExecutorSnapshot,
    GeneratorSnapshot,
    ModelSnapshot,
)
from tensord.generate.engine.engine import GenerationEngine
from tensord.registry.version import (
    EmbeddingVersion,
    GeneratorVersion,
    ModelVersion,
    PredictVersion,
)

POSTPROCESS_KINDS = frozenset({"topk", "nms", "pool"})
"""Processing steps that run on a model's outputs; the others run on its inputs."""
GENERATOR_EXECUTOR = "cpu"
"""Where a generation engine's steps run: on the host (see model_runner.py)."""


def model_snapshot(mv: ModelVersion) -> ModelSnapshot:
    """One version as Info shows it, its failure reason whole (the data plane redacts it
    for its caller)."""
    snapshot = ModelSnapshot(
        name=mv.name,
        version=mv.version,
        state=mv.state,
        reason=mv.reason,
        kind=mv.kind,
        backend=mv.config.backend,
        inputs=list(mv.inputs),
        outputs=list(mv.outputs),
        max_batch_size=mv.config.max_batch_size,
        load_time_s=mv.load_time_s,
        instance_count=_instances(mv),
    )
    if mv.placement is not None:
        snapshot.provider = mv.placement.provider
        snapshot.provider_reason = mv.placement.provider_reason
        snapshot.requested_providers = list(mv.placement.requested_providers)
    match mv:
        case EmbeddingVersion(spec=spec) if spec is not None:
            _add_predict(snapshot, mv)  # its batcher's counters too: texts, runs
            batcher = mv.batcher  # its budget as it runs (grown to max_seq_length if unset)
            snapshot.embedding = EmbeddingSnapshot(
                spec.max_seq_length,
                spec.dimensions,
                "+".join(spec.pooling) or "graph",
                spec.normalize,
                batcher.settings.max_batch_tokens if batcher is not None else 0,
            )
        case PredictVersion():
            _add_predict(snapshot, mv)
        case GeneratorVersion(engine=engine) if engine is not None:
            snapshot.executor = GENERATOR_EXECUTOR
            snapshot.generator = generator_snapshot(engine)
    return snapshot


def _add_predict(snapshot: ModelSnapshot, mv: PredictVersion) -> None:
    """What a predict model shows beyond what every version has."""
    snapshot.requests = dataclasses.replace(mv.requests)
    if mv.executor is not None:
        snapshot.executor = mv.executor.kind
        snapshot.executor_status = ExecutorSnapshot(mv.executor.stats(), mv.executor.reason)
    for report in mv.processing:
        if report.kind in POSTPROCESS_KINDS:
            snapshot.postprocess = report
        else:
            snapshot.preprocess = report
    batching = mv.config.dynamic_batching or mv.config.embedding
    if batching is None:
        return
    shown = BatchingSnapshot(
        preferred_batch_size=list(getattr(batching, "preferred_batch_size", [])),
        max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        max_queue_size=batching.max_queue_size,
        default_timeout_microseconds=getattr(batching, "default_timeout_microseconds", 0),
    )
    if mv.batcher is not None:
        s = mv.batcher.stats
        shown.served = True
        shown.batches, shown.requests, shown.rows = s.batches, s.requests, s.rows
        shown.expired, shown.rejected = s.expired, s.rejected
        shown.queue_depth = mv.batcher.queue_depth
        shown.concurrent_batches = mv.batcher.settings.instances
    snapshot.dynamic_batching = shown


def generator_snapshot(engine: GenerationEngine) -> GeneratorSnapshot:
    """A generation engine's limits and state."""
    limits = engine.limits
    return GeneratorSnapshot(
        max_model_len=limits.max_model_len,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_queue_size=limits.max_queue_size,
        block_bytes=limits.block_bytes,
        total_bytes=engine.kv.nbytes,
        stream_interval=limits.stream_interval,
        eos_token_ids=list(engine.directory.spec.eos_token_ids),
        batch_layout=engine.layout.layout.value,
        batch_layout_reason=engine.layout.reason,
        stats=engine.stats(),
        kv_path=engine.kv.name,
        kv_path_reason=engine.kv.reason,
        slot_bytes=engine.kv.slot_bytes,
        prefix_block_bytes=store.block_bytes if (store := engine.kv.prefix_store) else 0,
        constraints=engine.constraints.kinds,
    )


def _instances(mv: ModelVersion) -> int:
    """Runs that may execute at once, as served (not only as model.toml says)."""
    match mv:
        case GeneratorVersion():
            return 1  # the engine runs one step at a time, whatever model.toml's default says
        case PredictVersion(executor=executor) if executor is not None:
            return mv.config.instances_on(executor.kind)
    return mv.config.instance_count
