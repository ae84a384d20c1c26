"""`model.toml`: the settings of one model directory, validated when it is loaded."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tensord import dtypes
from tensord.config import format_validation_error
from tensord.config_tables import INT32_MAX, MAX_INSTANCES, MAX_THREADS, Settings
from tensord.errors import ModelLoadError
from tensord.files import read_toml
from tensord.modelconfig.embedding import EmbeddingConfig
from tensord.modelconfig.generator import GeneratorConfig
from tensord.modelconfig.processing import PostprocessConfig, PreprocessConfig
from tensord.modelconfig.providers import normalise_provider

MODEL_TOML = "model.toml"

ModelKind = Literal["predict", "generator", "embedding"]


class TensorOverride(Settings):
    """Narrows one input or output of the model's own signature."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """The tensor's name in the model."""
    dtype: str | None = None
    """Must equal the model's dtype when given (documents the contract)."""
    shape: list[int] | None = None
    """Same rank as the model; -1 keeps a dimension dynamic, a number fixes it."""

    @field_validator("dtype")
    @classmethod
    def _check_dtype(cls, value: str | None) -> str | None:
        if value is not None:
            dtypes.parse(value)
        return value

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(d < -1 for d in value):
            raise ValueError(f"dimensions must be -1 (dynamic) or >= 0, got {value}")
        return value


class DynamicBatchingConfig(Settings):
    """The `[dynamic_batching]` table: present means Predict requests are batched."""

    model_config = ConfigDict(extra="forbid")

    preferred_batch_size: list[int] = Field(default_factory=list)
    """Batch sizes that dispatch at once when reached."""
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    """How long a forming batch may wait for more requests after its oldest arrived."""
    max_queue_size: int = Field(default=0, ge=0)
    """Requests that may wait; beyond it RESOURCE_EXHAUSTED. 0 means unbounded."""
    default_timeout_microseconds: int = Field(default=0, ge=0)
    """Deadline for requests that bring none; 0 means none."""

    @field_validator("preferred_batch_size")
    @classmethod
    def _check_preferred(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError(f"preferred batch sizes must be >= 1, got {value}")
        return sorted(set(value))


class TensorRTConfig(Settings):
    """The `[tensorrt]` table: options for ONNX Runtime's TensorRT provider."""

    model_config = ConfigDict(extra="forbid")

    fp16: bool = False
    """Let TensorRT pick FP16 kernels."""
    engine_cache: bool = True
    """Keep built engines under the cache directory (keyed by ONNX Runtime)."""
    timing_cache: bool = True
    """Keep TensorRT's timing cache under the cache directory."""
    int8: bool = False
    """Native backend: build INT8 kernels (needs calibration_file)."""
    calibration_file: str | None = None
    """Native backend: a .npy of representative inputs for INT8 calibration."""
    min_batch: int = Field(default=1, ge=1, le=INT32_MAX)
    """Native backend: the optimisation profile's smallest batch."""
    opt_batch: int = Field(default=8, ge=1, le=INT32_MAX)
    """Native backend: the batch TensorRT tunes for."""
    max_batch: int = Field(default=64, ge=1, le=INT32_MAX)
    """Native backend: the optimisation profile's largest batch."""

    @model_validator(mode="after")
    def _check_profile(self) -> TensorRTConfig:
        if not self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError(
                f"tensorrt needs min_batch <= opt_batch <= max_batch, got "
                f"{self.min_batch}, {self.opt_batch}, {self.max_batch}"
            )
        return self


class ModelConfig(Settings):
    """One model's settings. Every key is optional; the directory name is the default name."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    """The served name; defaults to the directory name."""
    kind: ModelKind | None = None
    """"predict" (tensors in, tensors out), "generator" (a decoder that streams tokens) or
    "embedding" (texts in, vectors out); unset: detected, "generator" when model.onnx has
    config.json and tokenizer.json beside it (Hugging Face Optimum's layout) or a
    [generator] table is present, "embedding" for a sentence-transformers folder
    (modules.json and tokenizer.json beside onnx/model.onnx or model.onnx) or an [embedding]
    table."""
    generator: GeneratorConfig | None = None
    """The generation engine's limits (kind "generator"); the scan fills in the defaults."""
    embedding: EmbeddingConfig | None = None
    """How an embedding model is served (kind "embedding"); the scan fills in the defaults."""
    backend: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    """`onnxruntime` (any provider), or `tensorrt`: a native engine built from the ONNX file."""
    model_file: str = "model.onnx"
    """The model file inside each version directory (a relative path that stays inside it:
    no absolute path, no `..`)."""
    versions: list[int] = Field(default_factory=list)
    """Version directories to serve; empty serves every numbered directory."""
    required: bool = False
    """The daemon's health says NOT_SERVING while this model has no READY version, even
    when others serve (with the daemon's `[server] ready_when = "any_model"`, the default;
    `"all_models"` requires every model and `"always"` none). A reload applies a change to
    it without loading the model again."""
    preferred_provider: str | None = None
    """An execution provider to try first, when this host has it (e.g. "cuda")."""
    providers: list[str] = Field(default_factory=list)
    """Provider order; empty means TensorRT > CUDA > ROCm > CoreML > DirectML > OpenVINO > CPU."""
    intra_op_threads: int = Field(default=1, ge=0, le=MAX_THREADS)
    """Threads one run may use inside an operator; 0 lets ONNX Runtime use every core."""
    inter_op_threads: int = Field(default=1, ge=0, le=MAX_THREADS)
    """Threads for running independent operators in parallel; 0 is ONNX Runtime's default."""
    allow_spinning: bool = False
    """Let ONNX Runtime's threads spin while idle (fast when cores are free, collapses under
    contention)."""
    instance_count: int = Field(default=2, ge=1, le=MAX_INSTANCES)
    """Runs of this model that may execute at the same time."""
    max_batch_size: int = Field(default=0, ge=0, le=INT32_MAX)
    """Largest first (batch) dimension per request; 0 means the model does not batch."""
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig)
    """TensorRT provider options."""
    cuda_tf32: bool = False
    """Let ONNX Runtime's CUDA provider run float32 MatMul and Conv on TF32 tensor cores
    (Ampere and later): faster, with about 1e-3 relative error. Off, float32 models on the
    CUDA provider compute in float32 and agree with the CPU provider to float32 rounding
    (the TensorRT provider chooses its own precisions)."""
    dynamic_batching: DynamicBatchingConfig | None = None
    """Join compatible requests along the batch dimension (needs max_batch_size > 0)."""
    warmup: bool = True
    """Run the model once before it reports READY."""
    inputs: list[TensorOverride] = Field(default_factory=list)
    """Overrides for inputs."""
    outputs: list[TensorOverride] = Field(default_factory=list)
    """Overrides for outputs."""
    preprocess: PreprocessConfig | None = None
    """Serve raw uint8 images for one input, resized and normalised on the way in."""
    postprocess: PostprocessConfig | None = None
    """Serve top-k classes or boxes after NMS instead of the raw outputs they come from."""

    def instances_on(self, executor_kind: str) -> int:
        """Runs of this model that may execute at once on an executor of `executor_kind`
        (its lanes): instance_count, except for a model that batches on the host with
        instance_count unset. That one runs one batch at a time, on one lane: the batcher
        fills the batch with everything queued meanwhile, and a second batch beside it would
        only split the queue into smaller runs that cost more per request. A second lane
        taking turns with the first measured slower too (README: Batching and executors)."""
        if (
            executor_kind == "cpu"
            and (self.dynamic_batching is not None or self.kind == "embedding")
            and "instance_count" not in self.model_fields_set
        ):
            return 1
        return self.instance_count

    @model_validator(mode="after")
    def _check_kind(self) -> ModelConfig:
        if self.kind == "predict" and self.generator is not None:
            raise ValueError('a [generator] table needs kind = "generator"')
        if self.generator is not None and self.embedding is not None:
            raise ValueError("a model has a [generator] or an [embedding] table, not both")
        if self.embedding is not None and self.kind not in (None, "embedding"):
            raise ValueError('an [embedding] table needs kind = "embedding"')
        if self.generator is not None and self.kind == "embedding":
            raise ValueError('a [generator] table needs kind = "generator"')
        if self.dynamic_batching is not None and (
            self.kind == "embedding" or self.embedding is not None
        ):
            raise ValueError(
                "[dynamic_batching] is for predict models; an embedding model packs its texts "
                "by length (see [embedding])"
            )
        if self.dynamic_batching is not None and (
            self.kind == "generator" or self.generator is not None
        ):
            raise ValueError(
                "[dynamic_batching] is for predict models; a generator batches continuously "
                "(see [generator])"
            )
        return self

    @model_validator(mode="after")
    def _check_batching(self) -> ModelConfig:
        batching = self.dynamic_batching
        if batching is None:
            return self
        if self.max_batch_size == 0:
            raise ValueError("[dynamic_batching] needs max_batch_size > 0")
        too_big = [v for v in batching.preferred_batch_size if v > self.max_batch_size]
        if too_big:
            raise ValueError(
                f"dynamic_batching.preferred_batch_size {too_big} exceeds max_batch_size "
                f"{self.max_batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _check_tensorrt_profile(self) -> ModelConfig:
        if self.backend == "tensorrt" and self.max_batch_size > self.tensorrt.max_batch:
            raise ValueError(
                f"max_batch_size {self.max_batch_size} exceeds tensorrt.max_batch "
                f"{self.tensorrt.max_batch}: the engine's optimisation profile would refuse "
                "such batches; raise tensorrt.max_batch or lower max_batch_size"
            )
        return self

    @field_validator("versions")
    @classmethod
    def _check_versions(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError(f"versions are numbered from 1, got {value}")
        return sorted(set(value))

    @field_validator("preferred_provider")
    @classmethod
    def _check_preferred(cls, value: str | None) -> str | None:
        return None if value is None else normalise_provider(value)

    @field_validator("model_file")
    @classmethod
    def _check_model_file(cls, value: str) -> str:
        parts = PurePosixPath(value).parts
        if not value or "\0" in value or value.startswith(("/", "\\")) or ".." in parts:
            raise ValueError(
                "expected a file name inside the model's directory (a relative path with no "
                f"'..'), got {value!r}"
            )
        return value

    @field_validator("providers")
    @classmethod
    def _check_providers(cls, value: list[str]) -> list[str]:
        return [normalise_provider(v) for v in value]


def read_model_config(model_dir: Path) -> ModelConfig:
    """The directory's model.toml, or the defaults when it has none."""
    path = model_dir / MODEL_TOML
    if not path.exists() and not path.is_symlink():
        return ModelConfig()
    data = read_toml(path, ModelLoadError)
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ModelLoadError(format_validation_error(exc, str(path))) from None


# Keys a generator does not use, and what to do instead.
_PREDICT_ONLY_KEYS = {
    "backend": 'a generator runs on ONNX Runtime; backend = "tensorrt" is for predict models',
    "instance_count": "a generator runs one engine; generator.max_num_seqs bounds its sequences",
    "max_batch_size": "a generator batches continuously; its limits are in [generator]",
    "dynamic_batching": "a generator batches continuously; its limits are in [generator]",
    "intra_op_threads": "set generator.intra_op_threads instead",
    "inputs": "a generator takes prompts and streams tokens; its tensors are not overridden",
    "outputs": "a generator takes prompts and streams tokens; its tensors are not overridden",
    "preprocess": "pre- and postprocessing are for predict models",
    "postprocess": "pre- and postprocessing are for predict models",
}


def generator_key_problems(config: ModelConfig) -> list[str]:
    """The predict-only keys that `config` (a generator's) sets, each with what to do."""
    problems = []
    for key, hint in _PREDICT_ONLY_KEYS.items():
        default = ModelConfig.model_fields[key].get_default(call_default_factory=True)
        if key in config.model_fields_set and getattr(config, key) != default:
            shown = f"[{key}]" if key in ("dynamic_batching", "preprocess", "postprocess") else key
            problems.append(f"{shown} is not used by a generator ({hint})")
    return problems


# Keys an embedding model does not use, and what to do instead.
_NOT_FOR_EMBEDDINGS = {
    "backend": 'an embedding model runs on ONNX Runtime; backend = "tensorrt" is for predict '
    "models",
    "max_batch_size": "set embedding.max_batch_size (texts per run) instead",
    "dynamic_batching": "an embedding model packs its texts by length; see [embedding]",
    "inputs": "an embedding model takes texts; its tensors are not overridden",
    "outputs": "an embedding model returns vectors; its tensors are not overridden",
    "preprocess": "pre- and postprocessing are for predict models",
    "postprocess": "an embedding model's pooling comes from its folder or embedding.pooling",
}


def embedding_key_problems(config: ModelConfig) -> list[str]:
    """The keys that `config` (an embedding model's) sets but does not use, each with what
    to do."""
    problems = []
    for key, hint in _NOT_FOR_EMBEDDINGS.items():
        default = ModelConfig.model_fields[key].get_default(call_default_factory=True)
        if key in config.model_fields_set and getattr(config, key) != default:
            shown = f"[{key}]" if key in ("dynamic_batching", "preprocess", "postprocess") else key
            problems.append(f"{shown} is not used by an embedding model ({hint})")
    return problems
