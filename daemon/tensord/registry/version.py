"""A served model version: its state and what the data plane runs it with.

A version is a tagged union: a `PredictVersion` (an executor, maybe a batcher, tensors in
and out; an `EmbeddingVersion` is one, serving texts) or a `GeneratorVersion` (a generation
engine streaming tokens). Both share
`VersionBase`; callers tell them apart by type (`match`/`isinstance`) or by `kind`.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, TypeAlias

from tensord.backends.base import BackendPlacement, TensorSpec
from tensord.batching.batcher import DynamicBatcher
from tensord.executor.base import Executor
from tensord.inflight import InflightCounter
from tensord.modelconfig.model import ModelConfig
from tensord.processing.host import ProcessingReport
from tensord.registry.repository import Fingerprint, VersionSource

if TYPE_CHECKING:
    from tensord.embedding.folder import EmbeddingSpec
    from tensord.generate.engine.engine import GenerationEngine


class ModelState(enum.IntEnum):
    """Lifecycle of a model version; the values equal the contract's ModelState."""

    LOADING = 1
    READY = 2
    FAILED = 3
    UNLOADING = 4


_SERIALS = itertools.count(1)


@dataclass(slots=True)
class VersionBase:
    """What every served model version has, whatever its kind."""

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
    fingerprint: Fingerprint = ()
    """The version's files when it was loaded (a reload compares them)."""
    inflight: InflightCounter = field(default_factory=InflightCounter)
    """Requests running on it; it is freed only once they finish."""
    model_dir: Path | None = None
    serial: int = field(default_factory=lambda: next(_SERIALS), compare=False)
    """Unique to this load of the version in the process: a version replaced under the
    same number by a reload has a new one."""
    """The model's directory in the repository (a reload keeps what a broken one serves)."""


@dataclass(slots=True)
class RequestStats:
    """What a predict version's requests came to, whatever protocol brought them: counted
    by the data plane as each ends (one thread, the event loop's)."""

    succeeded: int = 0
    succeeded_s: float = 0.0
    """Their whole time, from the data plane's receipt to the answer."""
    failed: int = 0
    failed_s: float = 0.0
    queue_s: float = 0.0
    """Of the succeeded ones: time waiting for a batch or a lane."""
    compute_s: float = 0.0
    """Of the succeeded ones: time their runs took."""
    rows: int = 0
    """Inferences: rows along dimension 0 for a batching model, else one per request."""
    last_ms: int = 0
    """When the last one ended, in milliseconds since the epoch (0: none yet)."""


@dataclass(slots=True)
class PredictVersion(VersionBase):
    """A predict model: tensors in, tensors out, run by an executor."""

    kind: ClassVar[Literal["predict"]] = "predict"
    executor: Executor | None = None
    """Runs the model once it is loaded (None while loading, failed or freed)."""
    batcher: DynamicBatcher | None = None
    """Groups requests into batches when model.toml has [dynamic_batching]."""
    processing: list[ProcessingReport] = field(default_factory=list)
    """Pre- and postprocessing steps, and whether kernels or twins run them."""
    requests: RequestStats = field(default_factory=RequestStats)


@dataclass(slots=True)
class GeneratorVersion(VersionBase):
    """A generator model: a prompt in, a stream of tokens out, run by an engine."""

    kind: ClassVar[Literal["generator"]] = "generator"
    engine: GenerationEngine | None = None
    """The generation engine once it is loaded (None while loading, failed or freed)."""


@dataclass(slots=True)
class EmbeddingVersion(PredictVersion):
    """A text-embedding model: texts in, vectors out. Run as a predict model on token ids
    (its executor, and a batcher that packs texts by length); the data plane tokenises."""

    kind: ClassVar[Literal["embedding"]] = "embedding"  # type: ignore[assignment]
    spec: EmbeddingSpec | None = None
    """What its folder says (set once it is loaded)."""
    token_inputs: list[TensorSpec] = field(default_factory=list)
    """The model's own inputs (token ids, mask, ...), which its executor runs on."""


EMBED_INPUT = "text"
"""An embedding model's Predict input: BYTES [N], UTF-8 texts."""
EMBED_OUTPUT = "embedding"
"""An embedding model's Predict output: FP32 [N, dimensions]."""


ModelVersion: TypeAlias = PredictVersion | GeneratorVersion
"""One served model version of any kind (an EmbeddingVersion is a PredictVersion)."""


def from_source(src: VersionSource) -> ModelVersion:
    """A LOADING entry for a version found on disk, of the kind its model.toml names."""
    cls: type[ModelVersion] = {
        "generator": GeneratorVersion,
        "embedding": EmbeddingVersion,
    }.get(src.config.kind or "", PredictVersion)
    return cls(
        src.name,
        src.version,
        src.path,
        src.config,
        fingerprint=src.fingerprint,
        model_dir=src.model_dir,
    )
