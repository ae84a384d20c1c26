"""Who is calling and which models they may use, for the data plane to check.

The server's authentication interceptor sets the caller (a Principal) for the duration of
one call; the data plane asks `check_model` before it looks a model up, so a caller learns
nothing about models it may not use. With authentication off no principal is set and every
model is allowed. With authentication on, a call to an open method (health, reflection)
without a token is ANONYMOUS: it learns the server's status, and no model's name.
"""

from __future__ import annotations

import ast
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from tensord.errors import PermissionDeniedError, UnauthenticatedError

ANY_MODEL = "*"


@dataclass(slots=True, frozen=True)
class Principal:
    """An authenticated caller: the token's name and the models it may use."""

    name: str
    models: frozenset[str]
    model_control: bool = False
    """The token may load and unload models (model_control = "explicit")."""

    def may_use(self, model: str) -> bool:
        """True when the allow-list names the model or holds `*`."""
        return ANY_MODEL in self.models or model in self.models


ANONYMOUS = Principal("", frozenset())
"""The caller of an open method (health, reflection) that brings no token while
authentication is on: it may use no model and learns no model's name."""

current_principal: ContextVar[Principal | None] = ContextVar("tensord_principal", default=None)
"""The caller of the RPC running in this context; None when authentication is off."""


def check_model_control() -> None:
    """PERMISSION_DENIED unless the current caller may load and unload models: always with
    authentication off, else when its token has `model_control = true`."""
    principal = current_principal.get()
    if principal is not None and not principal.model_control:
        name = principal.name or "a caller without a token"
        raise PermissionDeniedError(
            f"{name!r} may not load or unload models: its token needs model_control = true in "
            "the token file"
        )


def may_see(model: str) -> bool:
    """Whether the current caller may learn about `model`: always with authentication off,
    never for an anonymous caller, otherwise when its token may use the model."""
    principal = current_principal.get()
    return principal is None or principal.may_use(model)


def may_probe(model: str) -> bool:
    """Whether the current caller may ask for the serving status of a model it names
    (grpc.health.v1 Check and Watch of `tensord.model.<name>`): as `may_see`, and an
    anonymous caller too, as load balancers probe a model by name without a token. It
    learns whether a name it already knows is served, and cannot list the others."""
    principal = current_principal.get()
    return principal is None or principal is ANONYMOUS or principal.may_use(model)


def sees_server_paths() -> bool:
    """Whether the current caller may read server paths in failure reasons: with
    authentication off, or a token allowed every model (an operator's)."""
    principal = current_principal.get()
    return principal is None or ANY_MODEL in principal.models


_QUOTED_PATH = re.compile(r"'/(?:[^'\\\n]++|\\.)*+'" + "|" + r'"/(?:[^"\\\n]++|\\.)*+"')
"""An absolute path quoted as Python's repr() quotes it (the registry's reasons quote the
paths outside the repository they name, which may hold spaces and quotes)."""
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/[^\s'\"`,;:()\[\]{}]+")
"""An unquoted absolute path, up to the first space or punctuation (other messages)."""


def redact_paths(text: str, root: Path) -> str:
    """`text` without server paths: those inside `root` (the model repository) relative to
    it, any other absolute path as its last part. A quoted path is replaced whole, spaces
    and quotes in it included; an unquoted one up to its first space."""
    for prefix in {str(root.resolve()), str(root.absolute())}:
        text = text.replace(prefix.rstrip("/") + "/", "")
    text = _QUOTED_PATH.sub(_last_part_quoted, text)
    return _ABSOLUTE_PATH.sub(lambda m: ".../" + _last_part(m.group(0)), text)


def _last_part(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _last_part_quoted(match: re.Match[str]) -> str:
    try:
        path = ast.literal_eval(match.group(0))
    except (SyntaxError, ValueError):  # not a repr() of its own: take it as it is
        path = match.group(0)[1:-1]
    return repr(".../" + _last_part(str(path)))


def check_model(model: str) -> None:
    """PERMISSION_DENIED unless the current caller may use `model`."""
    principal = current_principal.get()
    if principal is None or principal.may_use(model):
        return
    if principal is ANONYMOUS:
        raise UnauthenticatedError(
            f"a call without a token learns the server's status only; to ask about model "
            f"{model!r}, send the metadata 'authorization: Bearer <token>'"
        )
    allowed = ", ".join(sorted(principal.models)) or "none"
    raise PermissionDeniedError(
        f"token {principal.name!r} may not use model {model!r} (it may use: {allowed}); "
        "add the model to the token's models in the token file"
    )
