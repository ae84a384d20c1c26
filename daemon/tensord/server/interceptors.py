"""Server interceptors: authentication, with per-token rate limits.

An aio interceptor sees the method and the metadata, not the request message, so the
split is: the interceptor authenticates the caller and stores it in
`tensord.access.current_principal` (the call's handler runs in the same context), and the
data plane checks the model against it. Refusals end the call here, with the status and
message of the TensordError and the caller's x-request-id in the trailers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tensord.access import ANONYMOUS, current_principal
from tensord.errors import TensordError
from tensord.server.auth import Authenticator, has_authorization
from tensord.server.kit.rpc import failure_status, request_id
from tensord.server.watchdog import PROBED_METHOD, is_probe

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
# Called for every refused call: (method, status code).
RejectHook = Callable[[str, grpc.StatusCode], None]


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], exc: TensordError, method: str
) -> None:
    """End a refused call with its status, as every failed call ends (context.py)."""
    rpc = method.rpartition("/")[2]
    code, message, trailers = failure_status(exc, request_id(context), rpc)
    await context.abort(code, message, trailing_metadata=trailers)


def _refusal(
    handler: grpc.RpcMethodHandler, exc: TensordError, method: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with `exc`'s status."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _abort(context, exc, method)

    async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _abort(context, exc, method)
        yield  # pragma: no cover - abort raises; this makes it an async generator

    # No deserializer: a refused request's bytes are never parsed.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming)
    return grpc.unary_unary_rpc_method_handler(unary)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through when it brings a known bearer token within its rate."""

    def __init__(self, authenticator: Authenticator, on_reject: RejectHook | None = None) -> None:
        self._auth = authenticator
        self._on_reject = on_reject

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata
        # Anonymous until a token names the caller: an open method's caller without one
        # learns the server's status and no model's name (authentication off sets none).
        # The handler runs in this call's task, so it sees the principal set here.
        current_principal.set(ANONYMOUS)
        if method == PROBED_METHOD and is_probe(metadata):
            return await continuation(handler_call_details)
        if self._auth.is_open(method) and not has_authorization(metadata):
            # Anonymous, as load balancers and probes call it. A caller who brings a token
            # is that token's principal, open method or not: it sees its own models.
            return await continuation(handler_call_details)
        try:
            principal = self._auth.admit(handler_call_details.invocation_metadata)
        except TensordError as exc:
            handler = await continuation(handler_call_details)
            if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
                return None
            if self._on_reject is not None:
                self._on_reject(method, exc.code)
            return _refusal(handler, exc, method)
        # The handler runs in this call's task, so it sees the principal set here.
        current_principal.set(principal)
        return await continuation(handler_call_details)
