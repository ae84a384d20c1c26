"""Loading a generator version: its directory, backend session, engine and warm-up."""

from __future__ import annotations

from pathlib import Path

import structlog

from tensord.backends.base import BackendPlacement, DeviceOptions, TensorSpec
from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.engine.engine import GenerationEngine
from tensord.generate.model.model_dir import load_generator_dir
from tensord.generate.model.serving_graph import open_serving_graph
from tensord.generate.worker.model_runner import PassStats
from tensord.modelconfig.generator import GeneratorConfig
from tensord.modelconfig.model import ModelConfig

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
    session_config = config.model_copy(update={"intra_op_threads": limits.intra_op_threads})
    serving = open_serving_graph(spec, session_config, where, limits.layout)
    backend = serving.backend
    engine = GenerationEngine(
        name, directory, limits, backend.run, serving.layout, serving.position_ids
    )
    if config.warmup:
        try:
            _warm_up(engine)
        except Exception as exc:
            engine.close()
            backend.close()
            raise ModelLoadError(f"warm-up generation step failed: {exc}") from None
    log.info(
        "generator.batch_layout",
        model=name,
        layout=engine.layout.layout.value,
        reason=engine.layout.reason,
    )
    return engine, backend.placement, backend.inputs, backend.outputs


def _warm_up(engine: GenerationEngine) -> None:
    """A one-token prefill and a decode step on free blocks of the engine's own pool, so
    the first request pays no lazy set-up (the layout check warmed the session on a small
    pool of its own). The blocks stay free: a request writes its positions before reading.
    Two positions need two blocks when a block holds one token."""
    spec = engine.directory.spec
    token = spec.bos_token_id if spec.bos_token_id is not None else 0
    table = [0] if engine.storage.block_size > 1 else [0, 1]
    engine.runner.execute([ScheduledRequest("warm-up", [token], 0, table)])
    engine.runner.execute([ScheduledRequest("warm-up", [token], 1, table)])
    engine.runner.reset()
    engine.runner.stats = PassStats()
