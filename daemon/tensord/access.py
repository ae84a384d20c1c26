"""Who is calling and which models they may use, for the data plane to check.

The server's authentication interceptor sets the caller (a Principal) for the duration of
one call; the data plane asks `check_model` before it looks a model up, so a caller learns
nothing about models it may not use. With authentication off no principal is set and every
model is allowed.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

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


def may_see(model: str) -> bool:
    """Whether the current caller may learn about `model` (always, with authentication off
    or for an anonymous call to an open method)."""
    principal = current_principal.get()
    return principal is None or principal.may_use(model)


def sees_server_paths() -> bool:
    """Whether the current caller may read server paths in failure reasons: with
    authentication off, or a token allowed every model (an operator's)."""
    principal = current_principal.get()
    return principal is None or ANY_MODEL in principal.models


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/[^\s'\"`,;:()\[\]{}]+")


def redact_paths(text: str, root: Path) -> str:
    """`text` without server paths: those inside `root` (the model repository) relative to
    it, any other absolute path as its last part."""
    for prefix in {str(root.resolve()), str(root.absolute())}:
        text = text.replace(prefix.rstrip("/") + "/", "")
    return _ABSOLUTE_PATH.sub(lambda m: ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


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
