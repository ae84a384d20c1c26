"""The data plane's types: calls in, results and snapshots out, all plain dataclasses.

A transport (the gRPC server, or another) converts its messages to these and back and
needs nothing else from the layers below: the domain records it reads (a tensor's
signature, an executor's or an engine's counters, sampling parameters, stream chunks) are
re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tensord.backends.base import TensorSpec
from tensord.dataplane.admission import GeneratorEntry
from tensord.devices import CpuReport, GpuReport
from tensord.errors import UnavailableError
from tensord.executor.base import ExecutorStats
from tensord.generate.core.kv_cache_manager import KVCacheStats
from tensord.generate.core.outputs import RequestOutput, TokenLogprob
from tensord.generate.core.sampling_params import (
    DEFAULT_MAX_LOGPROBS,
    Constraint,
    ResolvedSamplingParams,
    SamplingParams,
)
from tensord.generate.engine.engine import EngineStats
from tensord.generate.model.hf_config import ChatTemplate
from tensord.processing.host import ProcessingReport
from tensord.registry.readiness import Readiness
from tensord.registry.registry import IndexEntry, not_found, pick_version
from tensord.registry.version import ModelState, RequestStats

__all__ = [
    "MAX_LOGPROBS",
    "BatchingSnapshot",
    "Constraint",
    "EmbedCall",
    "EmbedResult",
    "EmbedTokens",
    "EmbeddingEntry",
    "EmbeddingSnapshot",
    "EngineCoreRequest",
    "EngineStats",
    "ExecutorSnapshot",
    "ExecutorStats",
    "GenerateCall",
    "GeneratorSnapshot",
    "HealthReport",
    "IndexEntry",
    "KVCacheStats",
    "ModelHealth",
    "ModelSnapshot",
    "ModelState",
    "ModelTable",
    "PredictCall",
    "PredictResult",
    "ProcessingReport",
    "Readiness",
    "RequestOutput",
    "RequestStats",
    "SamplingParams",
    "ServerInfo",
    "TableEntry",
    "TensorSpec",
    "TokenLogprob",
]

MAX_LOGPROBS = DEFAULT_MAX_LOGPROBS
"""The most alternatives a request may ask to see per token."""


@dataclass(slots=True)
class PredictCall:
    """A Predict request after decoding."""

    model: str
    version: int
    inputs: list[tuple[str, np.ndarray]]
    output_names: list[str]
    deadline: float | None
    """time.monotonic() by which the answer is due, or None."""


@dataclass(slots=True)
class PredictResult:
    """A Predict answer before encoding."""

    model: str
    version: int
    outputs: list[tuple[str, np.ndarray]]
    queue_s: float
    compute_s: float


@dataclass(slots=True)
class EmbedCall:
    """An Embed request after decoding: texts, or token ids (one list a text)."""

    model: str
    version: int
    texts: list[str]
    token_ids: list[list[int]]
    truncate: bool = True
    """Cut a text longer than the model's max_seq_length there (as sentence-transformers'
    encode does); False: INVALID_ARGUMENT instead."""
    dimensions: int = 0
    """Keep the first this many values of each vector, normalised again (Matryoshka);
    0: all."""
    deadline: float | None = None


@dataclass(slots=True)
class EmbedTokens:
    """An Embed request as the data plane hands it to the engine: each text's token ids,
    one after another, for one exact version."""

    model: str
    version: int
    token_ids: np.ndarray
    """int64 [total]: every text's ids, in order."""
    lengths: np.ndarray
    """int64 [texts]: how many of them each text has."""
    deadline: float | None


@dataclass(slots=True)
class EmbedResult:
    """An Embed answer: one vector a text, and the tokens they took."""

    model: str
    version: int
    vectors: np.ndarray
    """float32 [texts, dimensions]."""
    prompt_tokens: int
    queue_s: float = 0.0
    compute_s: float = 0.0


@dataclass(slots=True)
class GenerateCall:
    """A Generate request after decoding: exactly one of prompt and prompt_token_ids."""

    model: str
    version: int
    prompt: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    deadline: float | None
    arrival: float = 0.0
    """time.monotonic() when the server received the request (0: when the data plane
    takes it); the stream's time to first token and inter-token times count from here."""
    priority: int = 0
    """Lower runs first; 0 is the default (core/scheduler.py)."""


@dataclass(slots=True)
class EngineCoreRequest:
    """A Generate request as the data plane hands it to the engine: checked, tokenised,
    its sampling parameters resolved, for one exact version."""

    model: str
    version: int
    prompt_token_ids: list[int]
    params: ResolvedSamplingParams
    deadline: float | None
    arrival: float
    """time.monotonic() when the server received the request."""
    priority: int = 0


@dataclass(slots=True)
class ModelHealth:
    """One version's state, and why it is not READY (as this caller may see it)."""

    name: str
    version: int
    state: ModelState
    reason: str


@dataclass(slots=True)
class HealthReport:
    """Overall serving state and the versions reported."""

    serving: bool
    models: list[ModelHealth]


@dataclass(slots=True)
class ExecutorSnapshot:
    """The executor a predict model runs on: its counters, and why it is that one."""

    stats: ExecutorStats
    reason: str


@dataclass(slots=True)
class BatchingSnapshot:
    """A predict model's [dynamic_batching] settings and, once loaded, its batcher's
    counters."""

    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int
    max_queue_size: int
    default_timeout_microseconds: int
    served: bool = False
    """The counters below are the batcher's (it exists: the model is loaded)."""
    batches: int = 0
    requests: int = 0
    rows: int = 0
    expired: int = 0
    rejected: int = 0
    queue_depth: int = 0
    concurrent_batches: int = 0


@dataclass(slots=True)
class GeneratorSnapshot:
    """A generator's limits and its engine's state."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_queue_size: int
    block_bytes: int
    total_bytes: int
    """The KV cache's storage."""
    stream_interval: int
    eos_token_ids: list[int]
    batch_layout: str
    batch_layout_reason: str
    stats: EngineStats
    kv_path: str = "paged"
    kv_path_reason: str = ""
    slot_bytes: int = 0
    prefix_block_bytes: int = 0
    """Bytes of one block of the prefix store on KV slots (0: none)."""
    constraints: tuple[str, ...] = ()
    """The constraint kinds Generate takes (structured output); empty: none."""


@dataclass(slots=True)
class EmbeddingSnapshot:
    """An embedding model's folder, as served."""

    max_seq_length: int
    dimensions: int
    pooling: str
    """The modes joined by "+", or "graph" when the model's graph pools."""
    normalized: bool
    max_batch_tokens: int


@dataclass(slots=True)
class ModelSnapshot:
    """One model version as Info reports it, whatever its kind."""

    name: str
    version: int
    state: ModelState
    reason: str
    """Why it is not READY, as this caller may see it."""
    kind: str
    backend: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    load_time_s: float
    instance_count: int
    """Runs that may execute at once, as served (not only as model.toml says)."""
    provider: str = ""
    provider_reason: str = ""
    requested_providers: list[str] = field(default_factory=list)
    executor: str = ""
    """The executor's kind ("cuda", "cpu"); a generator's steps run on the host: "cpu"."""
    executor_status: ExecutorSnapshot | None = None
    generator: GeneratorSnapshot | None = None
    embedding: EmbeddingSnapshot | None = None
    preprocess: ProcessingReport | None = None
    postprocess: ProcessingReport | None = None
    dynamic_batching: BatchingSnapshot | None = None
    requests: RequestStats | None = None
    """A predict model's requests so far (a copy)."""


@dataclass(slots=True, frozen=True)
class TableEntry:
    """One model version in the model table: what a frontend answers and checks without
    asking the engine."""

    name: str
    version: int
    state: ModelState
    reason: str
    """Why it is not READY, unredacted (a frontend redacts it for its caller)."""
    kind: str
    serial: int = 0
    """This load of the version (a version replaced under the same number by a reload
    has a new one)."""
    generator: GeneratorEntry | None = None
    """A READY generator's admission row."""
    tokenizer_path: str = ""
    """A READY generator's tokenizer.json."""
    prompt_prefix: tuple[int, ...] = ()
    """What a READY generator puts before a text prompt's tokens (its BOS, when it wants
    one)."""
    chat_template: ChatTemplate | None = None
    """A READY generator's chat template, if it has one."""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    max_batch_size: int = 0
    """A READY predict version's signature, which a frontend checks requests against."""
    embedding: EmbeddingEntry | None = None
    """A READY embedding version's row (its tokenizer file is `tokenizer_path`)."""


@dataclass(slots=True, frozen=True)
class EmbeddingEntry:
    """What a frontend needs to tokenise and check an embedding model's texts."""

    max_seq_length: int
    dimensions: int
    normalized: bool
    """Its vectors have unit length."""
    vocab_size: int
    prompt: str = ""
    """Put before every text."""
    lowercase: bool = False
    """Texts are lowercased before they are tokenised."""
    max_token_chars: int = 1
    """The most characters a token stands for: a text of more than max_seq_length x this
    many has more tokens than the model takes, and is cut (or refused) before tokenising."""


@dataclass(slots=True, frozen=True)
class ModelTable:
    """What the engine publishes whenever a version's state changes: the data plane
    answers health, finds the version a call goes to and checks its request from it."""

    loaded: bool
    """The engine has loaded (or failed) every model of the repository once."""
    readiness: Readiness
    """The readiness policy's verdict on the versions' states."""
    versions: tuple[TableEntry, ...] = ()
    by_name: dict[str, dict[int, TableEntry]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    """The versions by model name, then version."""

    def __post_init__(self) -> None:
        for entry in self.versions:
            self.by_name.setdefault(entry.name, {})[entry.version] = entry

    def find(self, name: str, version: int, redact: Callable[[str], str]) -> TableEntry:
        """The version a call for (`name`, `version`) goes to, as the registry picks it
        (registry.pick_version): NOT_FOUND, UNAVAILABLE or FAILED_PRECONDITION when none.
        A name the table lacks before every model has loaded once (an engine starting, or
        started again) is UNAVAILABLE: the repository may still hold it."""
        versions = self.by_name.get(name)
        if versions is None and not self.loaded:
            raise UnavailableError(
                f"model {name!r} is not known yet: the models are still loading; retry shortly"
            )
        return pick_version(name, versions, version, redact, self.names)

    def names(self) -> list[str]:
        return sorted(self.by_name)

    def counts(self) -> dict[str, int]:
        """Versions by state: {"loading": 0, "ready": 2, "failed": 1, "unloading": 0}."""
        counts = {state.name.lower(): 0 for state in ModelState}
        for e in self.versions:
            counts[e.state.name.lower()] += 1
        return counts

    def named(self, name: str) -> list[TableEntry]:
        """Every version of one model, oldest first; NOT_FOUND for an unknown name."""
        versions = self.by_name.get(name)
        if versions is None:
            raise not_found(name, self.names())
        return [versions[v] for v in sorted(versions)]


@dataclass(slots=True)
class ServerInfo:
    """Everything Info reports."""

    version: str
    runtime: dict[str, str]
    cpu: CpuReport
    gpu: GpuReport
    available_providers: list[str]
    tensorrt: str
    models: list[ModelSnapshot]
