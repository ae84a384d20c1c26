"""The data plane: what each RPC does, in domain types (plane.py), over an engine client
(engine_client.py; local.py runs the models in this process), and the types a transport
converts its messages to and from (types.py). Nothing here knows protobuf."""

from tensord.dataplane import types
from tensord.dataplane.admission import text_bytes
from tensord.dataplane.embedding import MAX_EMBED_INPUTS
from tensord.dataplane.engine_client import EngineClient
from tensord.dataplane.kinds import WrongKindError
from tensord.dataplane.local import LocalEngine
from tensord.dataplane.plane import (
    EMBEDDING,
    GENERATOR,
    NOT_SERVING,
    PREDICT,
    DataPlane,
)
from tensord.dataplane.types import *  # noqa: F403 (types.__all__, re-exported whole)
from tensord.registry.changes import RepositoryChanges
from tensord.registry.registry import BackendFactory, default_backend_factory

__all__ = [
    "EMBEDDING",
    "GENERATOR",
    "MAX_EMBED_INPUTS",
    "NOT_SERVING",
    "PREDICT",
    "BackendFactory",
    "DataPlane",
    "EngineClient",
    "LocalEngine",
    "RepositoryChanges",
    "WrongKindError",
    "default_backend_factory",
    "text_bytes",
]
__all__ += types.__all__
