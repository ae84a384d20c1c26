from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_TYPE_UNSPECIFIED: _ClassVar[DataType]
    DATA_TYPE_BOOL: _ClassVar[DataType]
    DATA_TYPE_UINT8: _ClassVar[DataType]
    DATA_TYPE_INT8: _ClassVar[DataType]
    DATA_TYPE_INT16: _ClassVar[DataType]
    DATA_TYPE_INT32: _ClassVar[DataType]
    DATA_TYPE_INT64: _ClassVar[DataType]
    DATA_TYPE_FLOAT16: _ClassVar[DataType]
    DATA_TYPE_BFLOAT16: _ClassVar[DataType]
    DATA_TYPE_FLOAT32: _ClassVar[DataType]
    DATA_TYPE_FLOAT64: _ClassVar[DataType]
    DATA_TYPE_STRING: _ClassVar[DataType]

class TensorEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENSOR_ENCODING_UNSPECIFIED: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_RAW: _ClassVar[TensorEncoding]
    TENSOR_ENCODING_CONTENTS: _ClassVar[TensorEncoding]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]

class ServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVING_STATUS_UNSPECIFIED: _ClassVar[ServingStatus]
    SERVING_STATUS_SERVING: _ClassVar[ServingStatus]
    SERVING_STATUS_NOT_SERVING: _ClassVar[ServingStatus]

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
    MODEL_STATE_NOT_LOADED: _ClassVar[ModelState]
DATA_TYPE_UNSPECIFIED: DataType
DATA_TYPE_BOOL: DataType
DATA_TYPE_UINT8: DataType
DATA_TYPE_INT8: DataType
DATA_TYPE_INT16: DataType
DATA_TYPE_INT32: DataType
DATA_TYPE_INT64: DataType
DATA_TYPE_FLOAT16: DataType
DATA_TYPE_BFLOAT16: DataType
DATA_TYPE_FLOAT32: DataType
DATA_TYPE_FLOAT64: DataType
DATA_TYPE_STRING: DataType
TENSOR_ENCODING_UNSPECIFIED: TensorEncoding
TENSOR_ENCODING_RAW: TensorEncoding
TENSOR_ENCODING_CONTENTS: TensorEncoding
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
SERVING_STATUS_UNSPECIFIED: ServingStatus
SERVING_STATUS_SERVING: ServingStatus
SERVING_STATUS_NOT_SERVING: ServingStatus
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_FAILED: ModelState
MODEL_STATE_UNLOADING: ModelState
MODEL_STATE_NOT_LOADED: ModelState

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "raw_data", "contents")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    RAW_DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    raw_data: bytes
    contents: TensorContents
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., raw_data: _Optional[bytes] = ..., contents: _Optional[_Union[TensorContents, _Mapping]] = ...) -> None: ...

class TensorContents(_message.Message):
    __slots__ = ("bool_values", "int_values", "int64_values", "float_values", "double_values", "bytes_values")
    BOOL_VALUES_FIELD_NUMBER: _ClassVar[int]
    INT_VALUES_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUES_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUES_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUES_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUES_FIELD_NUMBER: _ClassVar[int]
    bool_values: _containers.RepeatedScalarFieldContainer[bool]
    int_values: _containers.RepeatedScalarFieldContainer[int]
    int64_values: _containers.RepeatedScalarFieldContainer[int]
    float_values: _containers.RepeatedScalarFieldContainer[float]
    double_values: _containers.RepeatedScalarFieldContainer[float]
    bytes_values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, bool_values: _Optional[_Iterable[bool]] = ..., int_values: _Optional[_Iterable[int]] = ..., int64_values: _Optional[_Iterable[int]] = ..., float_values: _Optional[_Iterable[float]] = ..., double_values: _Optional[_Iterable[float]] = ..., bytes_values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("model", "version", "inputs", "output_names", "output_encoding")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAMES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    output_names: _containers.RepeatedScalarFieldContainer[str]
    output_encoding: TensorEncoding
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., output_names: _Optional[_Iterable[str]] = ..., output_encoding: _Optional[_Union[TensorEncoding, str]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("model", "version", "outputs", "timing")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    timing: Timing
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_us", "compute_us", "total_us")
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    queue_us: int
    compute_us: int
    total_us: int
    def __init__(self, queue_us: _Optional[int] = ..., compute_us: _Optional[int] = ..., total_us: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "version", "prompt", "prompt_token_ids", "sampling", "priority")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    priority: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "version", "texts", "token_ids", "truncate", "dimensions")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    texts: _containers.RepeatedScalarFieldContainer[str]
    token_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    truncate: bool
    dimensions: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., texts: _Optional[_Iterable[str]] = ..., token_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ..., truncate: _Optional[bool] = ..., dimensions: _Optional[int] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("model", "version", "embeddings", "prompt_tokens", "timing")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    prompt_tokens: int
    timing: Timing
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "constraint")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    logprobs: int
    constraint: Constraint
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[int] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "grammar")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: Choices
    grammar: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("index", "token_ids", "text", "logprobs", "finish_reason", "usage")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finish_reason: FinishReason
    usage: Usage
    def __init__(self, index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "time_to_first_token_ms", "mean_inter_token_ms")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_INTER_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_ms: float
    mean_inter_token_ms: float
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., time_to_first_token_ms: _Optional[float] = ..., mean_inter_token_ms: _Optional[float] = ...) -> None: ...

class RepositoryIndexRequest(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class RepositoryIndexResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelIndex]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelIndex, _Mapping]]] = ...) -> None: ...

class ModelIndex(_message.Message):
    __slots__ = ("name", "version", "state", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    state: ModelState
    reason: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "models")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    status: ServingStatus
    models: _containers.RepeatedCompositeFieldContainer[ModelHealth]
    def __init__(self, status: _Optional[_Union[ServingStatus, str]] = ..., models: _Optional[_Iterable[_Union[ModelHealth, _Mapping]]] = ...) -> None: ...

class ModelHealth(_message.Message):
    __slots__ = ("name", "version", "state", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    state: ModelState
    reason: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("server_version", "runtime", "cpu", "gpus", "gpu_unavailable_reason", "available_providers", "models", "cuda_driver_version", "cuda_runtime_version", "tensorrt", "endpoints")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORRT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    runtime: RuntimeVersions
    cpu: CpuInfo
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    gpu_unavailable_reason: str
    available_providers: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    cuda_driver_version: str
    cuda_runtime_version: str
    tensorrt: str
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    def __init__(self, server_version: _Optional[str] = ..., runtime: _Optional[_Union[RuntimeVersions, _Mapping]] = ..., cpu: _Optional[_Union[CpuInfo, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., gpu_unavailable_reason: _Optional[str] = ..., available_providers: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., cuda_driver_version: _Optional[str] = ..., cuda_runtime_version: _Optional[str] = ..., tensorrt: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("protocol", "address")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    address: str
    def __init__(self, protocol: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class RuntimeVersions(_message.Message):
    __slots__ = ("python", "onnxruntime", "grpcio", "protobuf", "numpy", "event_loop")
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    ONNXRUNTIME_FIELD_NUMBER: _ClassVar[int]
    GRPCIO_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    NUMPY_FIELD_NUMBER: _ClassVar[int]
    EVENT_LOOP_FIELD_NUMBER: _ClassVar[int]
    python: str
    onnxruntime: str
    grpcio: str
    protobuf: str
    numpy: str
    event_loop: str
    def __init__(self, python: _Optional[str] = ..., onnxruntime: _Optional[str] = ..., grpcio: _Optional[str] = ..., protobuf: _Optional[str] = ..., numpy: _Optional[str] = ..., event_loop: _Optional[str] = ...) -> None: ...

class CpuInfo(_message.Message):
    __slots__ = ("model", "architecture", "logical_cores")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_CORES_FIELD_NUMBER: _ClassVar[int]
    model: str
    architecture: str
    logical_cores: int
    def __init__(self, model: _Optional[str] = ..., architecture: _Optional[str] = ..., logical_cores: _Optional[int] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "name", "total_memory_bytes", "compute_capability")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    total_memory_bytes: int
    compute_capability: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., total_memory_bytes: _Optional[int] = ..., compute_capability: _Optional[str] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "unknown_rank")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_RANK_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    unknown_rank: bool
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., unknown_rank: _Optional[bool] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "state", "reason", "backend", "provider", "provider_reason", "requested_providers", "executor", "inputs", "outputs", "max_batch_size", "load_time_ms", "kind", "instance_count", "dynamic_batching", "executor_status", "preprocess", "postprocess", "generator", "embedding")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_BATCHING_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_STATUS_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    state: ModelState
    reason: str
    backend: str
    provider: str
    provider_reason: str
    requested_providers: _containers.RepeatedScalarFieldContainer[str]
    executor: str
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    max_batch_size: int
    load_time_ms: float
    kind: str
    instance_count: int
    dynamic_batching: DynamicBatching
    executor_status: ExecutorStatus
    preprocess: ProcessingStep
    postprocess: ProcessingStep
    generator: GeneratorStatus
    embedding: EmbeddingStatus
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ..., backend: _Optional[str] = ..., provider: _Optional[str] = ..., provider_reason: _Optional[str] = ..., requested_providers: _Optional[_Iterable[str]] = ..., executor: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., max_batch_size: _Optional[int] = ..., load_time_ms: _Optional[float] = ..., kind: _Optional[str] = ..., instance_count: _Optional[int] = ..., dynamic_batching: _Optional[_Union[DynamicBatching, _Mapping]] = ..., executor_status: _Optional[_Union[ExecutorStatus, _Mapping]] = ..., preprocess: _Optional[_Union[ProcessingStep, _Mapping]] = ..., postprocess: _Optional[_Union[ProcessingStep, _Mapping]] = ..., generator: _Optional[_Union[GeneratorStatus, _Mapping]] = ..., embedding: _Optional[_Union[EmbeddingStatus, _Mapping]] = ...) -> None: ...

class EmbeddingStatus(_message.Message):
    __slots__ = ("max_seq_length", "dimensions", "pooling", "normalized", "max_batch_tokens")
    MAX_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_seq_length: int
    dimensions: int
    pooling: str
    normalized: bool
    max_batch_tokens: int
    def __init__(self, max_seq_length: _Optional[int] = ..., dimensions: _Optional[int] = ..., pooling: _Optional[str] = ..., normalized: _Optional[bool] = ..., max_batch_tokens: _Optional[int] = ...) -> None: ...

class GeneratorStatus(_message.Message):
    __slots__ = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "max_queue_size", "running", "waiting", "kv_cache", "steps", "generated_tokens", "prefix_hit_tokens", "preemptions", "eos_token_ids", "stream_interval", "batch_layout", "batch_layout_reason", "model_passes", "pass_sequences", "max_pass_sequences", "kv_path", "kv_path_reason", "slot_bytes", "slot_moves", "step_seconds", "model_seconds", "prefix_query_tokens", "prefix_store", "prefix_bytes_loaded", "prefix_bytes_saved", "constraints")
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    BATCH_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BATCH_LAYOUT_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_PASSES_FIELD_NUMBER: _ClassVar[int]
    PASS_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_PASS_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KV_PATH_FIELD_NUMBER: _ClassVar[int]
    KV_PATH_REASON_FIELD_NUMBER: _ClassVar[int]
    SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_MOVES_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_STORE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_LOADED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_SAVED_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_queue_size: int
    running: int
    waiting: int
    kv_cache: KvCacheStatus
    steps: int
    generated_tokens: int
    prefix_hit_tokens: int
    preemptions: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stream_interval: int
    batch_layout: str
    batch_layout_reason: str
    model_passes: int
    pass_sequences: int
    max_pass_sequences: int
    kv_path: str
    kv_path_reason: str
    slot_bytes: int
    slot_moves: int
    step_seconds: float
    model_seconds: float
    prefix_query_tokens: int
    prefix_store: KvCacheStatus
    prefix_bytes_loaded: int
    prefix_bytes_saved: int
    constraints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_model_len: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache: _Optional[_Union[KvCacheStatus, _Mapping]] = ..., steps: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., preemptions: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., stream_interval: _Optional[int] = ..., batch_layout: _Optional[str] = ..., batch_layout_reason: _Optional[str] = ..., model_passes: _Optional[int] = ..., pass_sequences: _Optional[int] = ..., max_pass_sequences: _Optional[int] = ..., kv_path: _Optional[str] = ..., kv_path_reason: _Optional[str] = ..., slot_bytes: _Optional[int] = ..., slot_moves: _Optional[int] = ..., step_seconds: _Optional[float] = ..., model_seconds: _Optional[float] = ..., prefix_query_tokens: _Optional[int] = ..., prefix_store: _Optional[_Union[KvCacheStatus, _Mapping]] = ..., prefix_bytes_loaded: _Optional[int] = ..., prefix_bytes_saved: _Optional[int] = ..., constraints: _Optional[_Iterable[str]] = ...) -> None: ...

class KvCacheStatus(_message.Message):
    __slots__ = ("block_size", "total_blocks", "used_blocks", "free_blocks", "cached_blocks", "utilization", "block_bytes", "total_bytes")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    utilization: float
    block_bytes: int
    total_bytes: int
    def __init__(self, block_size: _Optional[int] = ..., total_blocks: _Optional[int] = ..., used_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., utilization: _Optional[float] = ..., block_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ProcessingStep(_message.Message):
    __slots__ = ("kind", "device", "description", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    device: str
    description: str
    reason: str
    def __init__(self, kind: _Optional[str] = ..., device: _Optional[str] = ..., description: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DynamicBatching(_message.Message):
    __slots__ = ("preferred_batch_size", "max_queue_delay_microseconds", "max_queue_size", "default_timeout_microseconds", "batches", "requests", "rows", "expired", "rejected", "queue_depth", "concurrent_batches")
    PREFERRED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIMEOUT_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CONCURRENT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    preferred_batch_size: _containers.RepeatedScalarFieldContainer[int]
    max_queue_delay_microseconds: int
    max_queue_size: int
    default_timeout_microseconds: int
    batches: int
    requests: int
    rows: int
    expired: int
    rejected: int
    queue_depth: int
    concurrent_batches: int
    def __init__(self, preferred_batch_size: _Optional[_Iterable[int]] = ..., max_queue_delay_microseconds: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., default_timeout_microseconds: _Optional[int] = ..., batches: _Optional[int] = ..., requests: _Optional[int] = ..., rows: _Optional[int] = ..., expired: _Optional[int] = ..., rejected: _Optional[int] = ..., queue_depth: _Optional[int] = ..., concurrent_batches: _Optional[int] = ...) -> None: ...

class ExecutorStatus(_message.Message):
    __slots__ = ("kind", "reason", "lanes", "queue_depth", "running", "pools")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    reason: str
    lanes: _containers.RepeatedCompositeFieldContainer[LaneStatus]
    queue_depth: int
    running: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    def __init__(self, kind: _Optional[str] = ..., reason: _Optional[str] = ..., lanes: _Optional[_Iterable[_Union[LaneStatus, _Mapping]]] = ..., queue_depth: _Optional[int] = ..., running: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ...) -> None: ...

class LaneStatus(_message.Message):
    __slots__ = ("index", "runs", "failed", "busy_seconds")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    index: int
    runs: int
    failed: int
    busy_seconds: float
    def __init__(self, index: _Optional[int] = ..., runs: _Optional[int] = ..., failed: _Optional[int] = ..., busy_seconds: _Optional[float] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("name", "in_use_bytes", "cached_bytes", "high_water_bytes", "allocations", "reuses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATER_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    REUSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    in_use_bytes: int
    cached_bytes: int
    high_water_bytes: int
    allocations: int
    reuses: int
    def __init__(self, name: _Optional[str] = ..., in_use_bytes: _Optional[int] = ..., cached_bytes: _Optional[int] = ..., high_water_bytes: _Optional[int] = ..., allocations: _Optional[int] = ..., reuses: _Optional[int] = ...) -> None: ...
