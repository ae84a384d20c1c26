"""What the data plane needs of the engine: one interface, two implementations.

`LocalEngine` (local.py) runs the models in this process; `RemoteEngine`
(tensord.procs.remote) reaches the engine process over the rings, where a `LocalEngine`
serves every frontend. The data plane above does not know which it has, as vLLM's
AsyncLLM does not know which EngineCoreClient it holds: it checks, tokenises, admits,
detokenizes and streams; the engine client runs what it is handed, for the exact version
the data plane picked from the model table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer

from tensord.config import TensordConfig
from tensord.dataplane.types import (
    EmbedResult,
    EmbedTokens,
    EngineCoreRequest,
    ModelSnapshot,
    ModelTable,
    PredictCall,
    PredictResult,
    ServerInfo,
    TableEntry,
)
from tensord.errors import DeviceLostError
from tensord.generate.engine.streams import OutputSink
from tensord.registry.changes import RepositoryChanges
from tensord.registry.registry import IndexEntry


class RepositoryControl(Protocol):
    """Loading and unloading the repository's models where they run (the registry)."""

    async def load_model(self, name: str) -> RepositoryChanges:
        """Load (or load again) one model of the repository (model_control = "explicit")."""

    async def unload_model(self, name: str) -> bool:
        """Unload one model once its calls end; False when it was not loaded."""

    async def repository_index(self) -> list[IndexEntry]:
        """Every model of the repository and every version served, with its state."""


class EngineClient(Protocol):
    """The engine as the data plane drives it."""

    on_table: Callable[[], None]
    """Called on the event loop whenever `table` changes."""
    on_device_lost: Callable[[DeviceLostError], None]
    """Called when a run or a load meets a sticky device error in this process."""

    @property
    def control(self) -> RepositoryControl:
        """Model control: the registry, or the engine process's over the control queries."""

    @property
    def table(self) -> ModelTable:
        """Every version's state, the readiness verdict, each READY version's row."""

    def tokenizer(self, entry: TableEntry) -> Tokenizer:
        """The tokenizer of a READY generator or embedding version of the table (an
        embedding model's truncates at its max_seq_length)."""

    async def predict(self, call: PredictCall) -> PredictResult:
        """Run a checked call on its exact version: inputs in signature order, every
        output named."""

    async def embed(self, call: EmbedTokens) -> EmbedResult:
        """Checked texts' token ids on their exact version: one vector a text, in order
        (full length: the data plane cuts Matryoshka dimensions)."""

    def add_generation(self, request: EngineCoreRequest, sink: OutputSink) -> str:
        """Start a checked request on its exact version; returns its id, by which its
        outputs reach `sink` (on the event loop). A refusal raises here or reaches the
        sink as a failure."""

    def abort_generation(self, request_id: str) -> None:
        """Nobody reads the request any more: stop it and free its KV cache."""

    def stop_generations(self, request_ids: Sequence[str]) -> None:
        """Stop strings ended these requests: they finish as stopped."""

    async def info(self) -> ServerInfo:
        """The server, devices, providers and every model version (reasons unredacted)."""

    async def snapshots(self, model: str) -> list[ModelSnapshot]:
        """Every version of `model` (a name the table has), or of every model ("")."""

    def apply(self, config: TensordConfig) -> None:
        """Take the settings a reload may change."""

    async def load_models(self) -> None:
        """Until every model of the repository has loaded or failed once."""

    async def reload_models(self, repository: Path) -> RepositoryChanges:
        """Scan the repository again (in this process; the engine process is told by the
        supervisor)."""

    def terminate_runs(self) -> None:
        """Cut every model run in progress short (the drain's grace has run out)."""

    async def close(self) -> None:
        """Unload what this process holds, or let go of the engine process."""
