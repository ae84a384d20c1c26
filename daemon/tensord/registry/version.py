"""A served model version: its state and what the data plane runs it with."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tensord.backends.base import BackendPlacement, TensorSpec
from tensord.batching.batcher import DynamicBatcher
from tensord.executor.base import Executor
from tensord.modelconfig.model import ModelConfig
from tensord.processing.host import ProcessingReport
from tensord.registry.inflight import InflightCounter
from tensord.registry.repository import Fingerprint, VersionSource

if TYPE_CHECKING:
    from tensord.generate.engine.engine import GenerationEngine


class ModelState(enum.IntEnum):
    """Lifecycle of a model version; the values equal the contract's ModelState."""

    LOADING = 1
    READY = 2
    FAILED = 3
    UNLOADING = 4


@dataclass(slots=True)
class ModelVersion:
    """One served model version and everything the data plane needs to run it."""

    name: str
    version: int
    path: Path
    config: ModelConfig
    state: ModelState = ModelState.LOADING
    reason: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    placement: BackendPlacement | None = None
    load_time_s: float = 0.0
    executor: Executor | None = None
    batcher: DynamicBatcher | None = None
    processing: list[ProcessingReport] = field(default_factory=list)
    """Pre- and postprocessing steps, and whether kernels or twins run them."""
    engine: GenerationEngine | None = None
    """The generation engine, for a generator (kind "generator")."""
    fingerprint: Fingerprint = ()
    """The version's files when it was loaded (a reload compares them)."""
    inflight: InflightCounter = field(default_factory=InflightCounter)
    """Requests running on it; it is freed only once they finish."""
    model_dir: Path | None = None
    """The model's directory in the repository (a reload keeps what a broken one serves)."""

    @property
    def kind(self) -> str:
        """ "predict" or "generator"."""
        return self.config.kind or "predict"

    @classmethod
    def from_source(cls, src: VersionSource) -> ModelVersion:
        """A LOADING entry for a version found on disk."""
        return cls(
            src.name,
            src.version,
            src.path,
            src.config,
            fingerprint=src.fingerprint,
            model_dir=src.model_dir,
        )
