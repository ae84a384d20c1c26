"""Loading a generator version: its directory, backend session, engine and warm-up.

A model-builder folder (genai_config.json; fused GroupQueryAttention) is served on KV
slots; an Optimum export on the paged pool, with its batch layout checked at load
(kv_paths.py says what each path does)."""

from __future__ import annotations

from pathlib import Path

import structlog

from tensord.backends.base import BackendPlacement, DeviceOptions, TensorSpec
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.engine.kv_paths import paged_kv_path, slot_kv_path
from tensord.generate.model.model_dir import GeneratorDirectory, load_generator_dir
from tensord.generate.model.serving_graph import open_serving_graph
from tensord.generate.model.slot_graph import (
    check_slots,
    open_slot_session,
    slot_layout,
    slot_runner,
)
from tensord.generate.worker.model_runner import PassStats
from tensord.modelconfig.generator import GeneratorConfig
from tensord.modelconfig.model import ModelConfig

log = structlog.get_logger("tensord.generate")


def load_engine(
    name: str, model_path: Path, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, BackendPlacement, list[TensorSpec], list[TensorSpec]]:
    """Read the directory beside `model_path`, open the session, size the KV cache and
    start the engine (warmed up with a prefill and a decode step when config.warmup)."""
    directory = load_generator_dir(model_path.parent, config.model_file)
    for note in directory.spec.notes:
        log.warning("generator.config_note", model=name, note=note)
    if directory.spec.genai is not None:
        engine, backend = _slot_engine(name, directory, config, where)
    else:
        engine, backend = _paged_engine(name, directory, config, where)
    if config.warmup:
        try:
            _warm_up(engine)
        except Exception as exc:
            engine.close()
            backend.close()
            raise ModelLoadError(f"warm-up generation step failed: {exc}") from None
    log.info(
        "generator.kv_path",
        model=name,
        kv_path=engine.kv.name,
        batch_layout=engine.layout.layout.value,
        reason=engine.layout.reason,
        slots=engine.limits.num_blocks if engine.kv.slots is not None else None,
        kv_bytes=engine.kv.nbytes,
    )
    return engine, backend.placement, backend.inputs, backend.outputs


def _paged_engine(
    name: str, directory: GeneratorDirectory, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, OnnxRuntimeBackend]:
    spec = directory.spec
    limits = (config.generator or GeneratorConfig()).resolve(
        context_length=spec.context_length, kv_bytes_per_token=spec.kv_bytes_per_token
    )
    session_config = config.model_copy(update={"intra_op_threads": limits.intra_op_threads})
    serving = open_serving_graph(spec, session_config, where, limits.layout)
    kv = paged_kv_path(spec, limits, serving.backend.run, serving.layout, serving.position_ids)
    return GenerationEngine(name, directory, limits, kv), serving.backend


def _slot_engine(
    name: str, directory: GeneratorDirectory, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, OnnxRuntimeBackend]:
    spec = directory.spec
    generator = config.generator or GeneratorConfig()
    session_config = config.model_copy(update={"intra_op_threads": generator.intra_op_threads})
    session = open_slot_session(spec, session_config, where)
    try:
        limits = generator.resolve_slots(
            context_length=spec.context_length,
            slot_bytes=lambda length: slot_layout(spec, length, session.device).slot_bytes,
            budget_bytes=session.kv_budget_bytes,
        )
        runner = slot_runner(
            session, spec, limits.max_model_len, limits.num_blocks, limits.max_num_batched_tokens
        )
        check_slots(runner, spec, limits.max_model_len)
        kv = slot_kv_path(runner, limits.max_model_len)
    except BaseException:
        session.backend.close()
        raise
    return GenerationEngine(name, directory, limits, kv), session.backend


def _warm_up(engine: GenerationEngine) -> None:
    """A one-token prefill and a decode step on free KV space of the engine's own, so the
    first request pays no lazy set-up. Nothing is kept: a request writes its positions
    before reading them. Two positions need two blocks when a block holds one token."""
    spec = engine.directory.spec
    token = spec.bos_token_id if spec.bos_token_id is not None else 0
    table = [0] if engine.limits.block_size > 1 else [0, 1]
    engine.runner.execute([ScheduledRequest("warm-up", [token], 0, table)])
    engine.runner.execute([ScheduledRequest("warm-up", [token], 1, table)])
    engine.runner.reset()
    engine.runner.stats = PassStats()
