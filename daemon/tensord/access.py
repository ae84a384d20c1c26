"""Who is calling and which models they may use, for the data plane to check.

The server's authentication interceptor sets the caller (a Principal) for the duration of
one call; the data plane asks `check_model` before it looks a model up, so a caller learns
nothing about models it may not use. With authentication off no principal is set and every
model is allowed.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from tensord.errors import PermissionDeniedError

ANY_MODEL = "*"


@dataclass(slots=True, frozen=True)
class Principal:
    """An authenticated caller: the token's name and the models it may use."""

    name: str
    models: frozenset[str]

    def may_use(self, model: str) -> bool:
        """True when the allow-list names the model or holds `*`."""
        return ANY_MODEL in self.models or model in self.models


current_principal: ContextVar[Principal | None] = ContextVar("tensord_principal", default=None)
"""The caller of the RPC running in this context; None when authentication is off."""


def check_model(model: str) -> None:
    """PERMISSION_DENIED unless the current caller may use `model`."""
    principal = current_principal.get()
    if principal is None or principal.may_use(model):
        return
    allowed = ", ".join(sorted(principal.models)) or "none"
    raise PermissionDeniedError(
        f"token {principal.name!r} may not use model {model!r} (it may use: {allowed}); "
        "add the model to the token's models in the token file"
    )
