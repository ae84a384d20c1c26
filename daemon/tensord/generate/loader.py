"""Loading a generator version: its directory, backend session, engine and warm-up."""

from __future__ import annotations

from pathlib import Path

import structlog

from tensord.backends.base import BackendPlacement, DeviceOptions, TensorSpec
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import ModelLoadError
from tensord.generate.batch_layout import choose_layout, restrict
from tensord.generate.engine import GenerationEngine
from tensord.generate.layout_check import check_layout
from tensord.generate.model_dir import load_generator_dir
from tensord.generate.model_runner import PassStats, StepItem
from tensord.registry.generator_config import GeneratorConfig
from tensord.registry.model_config import ModelConfig

log = structlog.get_logger("tensord.generate")


def load_engine(
    name: str, model_path: Path, config: ModelConfig, where: DeviceOptions
) -> tuple[GenerationEngine, BackendPlacement, list[TensorSpec], list[TensorSpec]]:
    """Read the directory beside `model_path`, open the session, size the KV pool and
    start the engine (warmed up with a prefill and a decode step when config.warmup)."""
    directory = load_generator_dir(model_path.parent, config.model_file)
    spec = directory.spec
    for note in spec.notes:
        log.warning("generator.config_note", model=name, note=note)
    limits = (config.generator or GeneratorConfig()).resolve(
        context_length=spec.context_length, kv_bytes_per_token=spec.kv_bytes_per_token
    )
    try:
        layout = restrict(choose_layout(spec.model_type, spec.has_position_ids), limits.layout)
    except ValueError as exc:
        raise ModelLoadError(f"[generator] {exc}") from None
    session_config = config.model_copy(update={"intra_op_threads": limits.intra_op_threads})
    backend = OnnxRuntimeBackend(spec.model_path, session_config, where)
    engine = GenerationEngine(name, directory, limits, backend.run, layout)
    try:
        _check_and_warm_up(engine, config.warmup)
    except ModelLoadError:
        engine.close()
        raise
    except Exception as exc:
        engine.close()
        raise ModelLoadError(f"warm-up generation step failed: {exc}") from None
    log.info(
        "generator.batch_layout",
        model=name,
        layout=engine.layout.layout.value,
        reason=engine.layout.reason,
    )
    return engine, backend.placement, backend.inputs, backend.outputs


def _check_and_warm_up(engine: GenerationEngine, warmup: bool) -> None:
    """Check the batch layout on the model (layout_check.py); those steps also warm it
    up. Where the pool is too small for the check, and warm-up is on, a one-token prefill
    and a decode step on free blocks stand in, so the first request pays no lazy set-up.
    The blocks stay free: a request writes its positions before reading."""
    spec = engine.directory.spec
    half = spec.kv_dtype.numpy.itemsize < 4
    engine.layout = check_layout(engine.runner, engine.layout, spec.vocab_size, half)
    if engine.runner.stats.passes == 0 and warmup:
        token = spec.bos_token_id if spec.bos_token_id is not None else 0
        table = [0] if engine.storage.block_size > 1 else [0, 1]
        engine.runner.execute([StepItem("warm-up", [token], 0, table)])
        engine.runner.execute([StepItem("warm-up", [token], 1, table)])
        engine.runner.reset()
    engine.runner.stats = PassStats()
