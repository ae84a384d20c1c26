"""The data plane: what each RPC does, in domain types (plane.py), and the types a
transport converts its messages to and from (types.py). Nothing here knows protobuf."""

from tensord.dataplane.admission import text_bytes
from tensord.dataplane.plane import NOT_SERVING, DataPlane
from tensord.dataplane.types import (
    MAX_LOGPROBS,
    BatchingSnapshot,
    EngineStats,
    ExecutorSnapshot,
    ExecutorStats,
    GenerateCall,
    GeneratorSnapshot,
    HealthReport,
    ModelHealth,
    ModelSnapshot,
    ModelState,
    ModelTable,
    PredictCall,
    PredictResult,
    ProcessingReport,
    Readiness,
    RequestOutput,
    RequestStats,
    SamplingParams,
    ServerInfo,
    TableEntry,
    TensorSpec,
    TokenLogprob,
)
from tensord.registry.changes import RepositoryChanges
from tensord.registry.registry import BackendFactory, default_backend_factory

__all__ = [
    "MAX_LOGPROBS",
    "NOT_SERVING",
    "BackendFactory",
    "BatchingSnapshot",
    "DataPlane",
    "EngineStats",
    "ExecutorSnapshot",
    "ExecutorStats",
    "GenerateCall",
    "GeneratorSnapshot",
    "HealthReport",
    "ModelHealth",
    "ModelSnapshot",
    "ModelState",
    "ModelTable",
    "PredictCall",
    "PredictResult",
    "ProcessingReport",
    "Readiness",
    "RepositoryChanges",
    "RequestOutput",
    "RequestStats",
    "SamplingParams",
    "ServerInfo",
    "TableEntry",
    "TensorSpec",
    "TokenLogprob",
    "default_backend_factory",
    "text_bytes",
]
