"""Model control on request: load, unload and the repository index, checked for the
caller (a token allowed `model_control` and the model) and with reasons redacted for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tensord.access import check_model, check_model_control, may_see
from tensord.dataplane.engine_client import EngineClient
from tensord.errors import FailedPreconditionError
from tensord.registry.changes import RepositoryChanges
from tensord.registry.registry import IndexEntry
from tensord.registry.version import ModelState


class ModelControl:
    """KServe's repository RPCs (and tensord.v1's), over the engine client's registry."""

    def __init__(self, engine: EngineClient, shown: Callable[[str], str]) -> None:
        self._engine = engine
        self._shown = shown

    async def load(self, name: str) -> RepositoryChanges:
        """Load (or load again) one model of the repository: FAILED_PRECONDITION when
        model control is off or no version of it became READY (why, as the caller may see
        it)."""
        check_model_control()
        check_model(name)
        try:
            return await self._engine.control.load_model(name)
        except FailedPreconditionError as exc:
            raise FailedPreconditionError(self._shown(exc.message)) from None

    async def unload(self, name: str) -> bool:
        """Unload one model once its calls end; False when it was not loaded."""
        check_model_control()
        check_model(name)
        return await self._engine.control.unload_model(name)

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """The models of the repository the caller may see, each version's state and reason
        (redacted for the caller); only READY ones when `ready_only`."""
        index = await self._engine.control.repository_index()
        return [
            dataclasses.replace(e, reason=self._shown(e.reason)) if e.reason else e
            for e in index
            if may_see(e.name) and (e.state is ModelState.READY or not ready_only)
        ]
