"""The HTTP endpoints: each request authenticated with the gRPC port's bearer tokens and
rate limits, bounded like a gRPC request, served by the data plane, and recorded in the
same metrics and logs (the one mapping of errors to statuses, server/kit/rpc.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tensord.access import current_principal
from tensord.dataplane import (
    EMBEDDING,
    GENERATOR,
    DataPlane,
    GenerateCall,
    RequestOutput,
    text_bytes,
)
from tensord.errors import RateLimitedError, ResourceExhaustedError, UnavailableError
from tensord.observability import RequestObserver
from tensord.observability.tracing import HttpExchange
from tensord.server.auth import AUTHORIZATION, Authenticator
from tensord.server.kit.intake import Intake
from tensord.server.kit.rpc import (
    REQUEST_ID,
    StreamSlots,
    failure_status,
    new_request_id,
    sane_request_id,
)
from tensord.server.openai.embeddings import embed_request, embed_response, response_bytes
from tensord.server.openai.requests import (
    GenerationRequest,
    RequestError,
    chat_request,
    check_token_ids,
    completion_request,
)
from tensord.server.openai.responses import (
    HTTP_STATUS,
    Logprobs,
    Shapes,
    error_body,
    usage,
)
from tensord.server.openai.stream import EventStream, events

log = structlog.get_logger("tensord.request")

Handler = Callable[[Request, "Call"], Awaitable[Response]]
T = TypeVar("T")


_INLINE_BODY_BYTES = 64 * 1024
"""Chat bodies up to this size are checked on the event loop, larger ones on a thread."""


class BodyTooLarge(ResourceExhaustedError):
    """A request body over [openai] max_body_bytes (HTTP 413)."""


class ErrorResponse(JSONResponse):
    """An error body, written in ASCII: its message and `param` may quote what the request
    held, lone surrogates of JSON escapes included, which UTF-8 cannot carry."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


class Gone(Response):
    """The answer to a client that disconnected before it was ready (nobody reads it)."""


class Call:
    """One HTTP request's bookkeeping: its id, the model once known, when it started."""

    def __init__(self, request: Request, rpc: str, route: str) -> None:
        given = request.headers.get(REQUEST_ID)
        self.id: str = given if given is not None and sane_request_id(given) else new_request_id()
        self.rpc = rpc
        self.model = ""
        self.start = time.perf_counter()
        self.method = request.method
        self.route = route
        self.headers = request.headers.items()
        self.status = 200
        """The response's HTTP status (a stream's stays 200 whatever ends it)."""


_CLOSING = (
    "the server is shutting down before this request's body arrived; retry on another instance"
)


class OpenAIRoutes:
    """The API's routes over one data plane, with the gRPC port's admission."""

    def __init__(
        self,
        dataplane: DataPlane,
        authenticator: Authenticator | None,
        observer: RequestObserver | None,
        intake: Intake,
        stream_slots: StreamSlots | None,
        max_body_bytes: int,
    ) -> None:
        self.dataplane = dataplane
        self.authenticator = authenticator
        self.observer = observer
        self.intake = intake
        self.stream_slots = stream_slots
        self.max_body_bytes = max_body_bytes
        self._reading: set[asyncio.Task[Any]] = set()
        """Requests whose body is still arriving."""
        self._closed = False

    def close_intake(self) -> None:
        """The drain begins: requests whose body has not arrived end at once with 503 (a
        client that never sends it must not hold the drain), and later ones too."""
        self._closed = True
        for task in list(self._reading):
            task.cancel(_CLOSING)

    def app(self) -> Starlette:
        """The ASGI application."""
        return Starlette(
            routes=[
                self._route("GET", "/v1/models", "openai.models", self._models),
                self._route("POST", "/v1/completions", "openai.completions", self._completions),
                self._route("POST", "/v1/chat/completions", "openai.chat_completions", self._chat),
                self._route("POST", "/v1/embeddings", "openai.embeddings", self._embeddings),
            ]
        )

    def _route(self, method: str, path: str, rpc: str, handler: Handler) -> Route:
        """`path` served by `handler`, recorded in metrics and logs as `rpc`."""

        async def endpoint(request: Request) -> Response:
            call = Call(request, rpc, path)
            try:
                self._authenticate(request)
                response = await handler(request, call)
            except Exception as exc:
                response = self.failed(call, exc)
            else:
                if not isinstance(response, (EventStream, Gone)):  # recorded where they end
                    self.finished(call, grpc.StatusCode.OK)
            response.headers[REQUEST_ID] = call.id
            return response

        return Route(path, endpoint, methods=[method])

    def _authenticate(self, request: Request) -> None:
        """As the gRPC interceptor: the caller named by its bearer token, after one request
        of its rate (authentication off: every model is allowed)."""
        if self.authenticator is None:
            return
        header = request.headers.get(AUTHORIZATION)
        metadata = [] if header is None else [(AUTHORIZATION, header)]
        current_principal.set(self.authenticator.admit(metadata))

    def finished(self, call: Call, code: grpc.StatusCode, message: str = "") -> None:
        """Metrics and the span of a call that ended with `code`."""
        if self.observer is not None:
            elapsed = time.perf_counter() - call.start
            http = (HttpExchange(call.method, call.route, call.status), call.headers)
            self.observer.finished(
                call.rpc, call.model, code, elapsed, call.id, None, message, http
            )

    def failed(self, call: Call, exc: BaseException) -> Response:
        """The error's log line, metrics, and OpenAI-shaped body."""
        total_ms = round((time.perf_counter() - call.start) * 1e3, 3)
        code, message, _ = failure_status(exc, call.id, call.rpc, total_ms)
        status = 413 if isinstance(exc, BodyTooLarge) else HTTP_STATUS.get(code, 500)
        call.status = status
        self.finished(call, code, message)
        param = exc.param if isinstance(exc, RequestError) else None
        headers = {}
        if isinstance(exc, RateLimitedError):
            headers["retry-after"] = str(max(1, round(exc.retry_after_s + 0.5)))
        return ErrorResponse(error_body(code, message, param, status), status, headers)

    def _gone(self, call: Call) -> Gone:
        """The client disconnected before its answer was ready: logged and recorded as
        cancelled (HTTP 499, which nobody reads)."""
        log.info("request.cancelled", request_id=call.id, rpc=call.rpc, status="CANCELLED")
        call.status = 499
        self.finished(call, grpc.StatusCode.CANCELLED)
        return Gone(status_code=499)

    async def _body(self, request: Request) -> tuple[Any, int]:
        """The JSON body and its size, read up to [openai] max_body_bytes (the body is
        parsed on the event loop: the limit bounds how long that takes)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(
                f"the request body takes {declared} bytes, more than the {limit} a request "
                "may have ([openai] max_body_bytes)"
            )
        task = asyncio.current_task()
        assert task is not None
        if self._closed:
            raise UnavailableError(_CLOSING)
        parts, size = [], 0
        self._reading.add(task)
        try:
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise BodyTooLarge(
                        f"the request body takes more than the {limit} bytes a request may "
                        "have ([openai] max_body_bytes)"
                    )
                parts.append(part)
        except asyncio.CancelledError as exc:
            if exc.args != (_CLOSING,):
                raise
            task.uncancel()
            raise UnavailableError(_CLOSING) from None
        finally:
            self._reading.discard(task)
        try:
            return json.loads(b"".join(parts)), size
        # ValueError covers JSONDecodeError and an integer of more digits than Python
        # converts (sys.get_int_max_str_digits).
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RequestError(f"the request body is not valid JSON: {exc}") from None

    async def _models(self, request: Request, call: Call) -> Response:
        models = [
            {"id": name, "object": "model", "created": 0, "owned_by": "tensord"}
            for name in self.dataplane.openai_models()
        ]
        return JSONResponse({"object": "list", "data": models})

    async def _completions(self, request: Request, call: Call) -> Response:
        arrival = time.monotonic()
        body, size = await self._body(request)
        req = completion_request(body)
        return await self._generate(req, request, call, size, arrival, chat=False)

    async def _chat(self, request: Request, call: Call) -> Response:
        arrival = time.monotonic()
        body, size = await self._body(request)
        # Each message is checked in Python: a body of many gives the loop its turns.
        large = size > _INLINE_BODY_BYTES
        req = await asyncio.to_thread(chat_request, body) if large else chat_request(body)
        return await self._generate(req, request, call, size, arrival, chat=True)

    async def _embeddings(self, request: Request, call: Call) -> Response:
        body, size = await self._body(request)
        large = size > _INLINE_BODY_BYTES
        embed, encoding = (
            await asyncio.to_thread(embed_request, body) if large else embed_request(body)
        )
        call.model = embed.model
        entry = self.dataplane.lookup(embed.model, 0, EMBEDDING)
        with self.intake.budget(size):
            result = await _unless_disconnected(request, self.dataplane.embed(embed, entry))
        if result is None:
            return self._gone(call)
        if response_bytes(result.vectors, encoding) > _INLINE_BODY_BYTES:
            content = await asyncio.to_thread(embed_response, result, encoding, embed.model)
        else:
            content = embed_response(result, encoding, embed.model)
        return Response(content, media_type="application/json")

    async def _generate(
        self,
        req: GenerationRequest,
        request: Request,
        call: Call,
        size: int,
        arrival: float,
        chat: bool,
    ) -> Response:
        """Admit the request (up to its first chunk: every refusal comes before the
        response starts), then answer whole or as a stream. It holds its bytes of the
        in-flight budget and a stream slot, as a gRPC Generate does, until it ends."""
        call.model = req.model
        entry = self.dataplane.lookup(req.model, 0, GENERATOR)
        # By size first: a prompt certainly too long for the model is refused before its
        # ids are looked at one by one or its text is tokenised.
        prompt_bytes = text_bytes(req.prompt)
        self.dataplane.check_prompt_size(entry, prompt_bytes, len(req.prompt_token_ids))
        check_token_ids(req.prompt_token_ids)
        held = contextlib.AsyncExitStack()
        try:
            held.enter_context(self.intake.budget(size))
            ids = req.prompt_token_ids
            if chat:
                ids = await self.dataplane.chat_prompt(entry, req.messages)
            if self.stream_slots is not None:
                held.enter_context(self.stream_slots.held())
            generate = GenerateCall(req.model, 0, req.prompt, ids, req.sampling, None, arrival)
            logprobs = None
            if req.logprobs is not None:
                logprobs = Logprobs(chat, req.logprobs, self.dataplane.token_texts(entry))
            chunks = self.dataplane.generate(generate, entry)
            held.push_async_callback(chunks.aclose)
            first = await anext(chunks)
        except BaseException:
            await held.aclose()
            raise
        shapes = Shapes(chat, req.model, call.id, logprobs)
        if req.stream:
            ended = self._stream_ended(call, held)
            return EventStream(events(first, chunks, shapes, req.include_usage, ended), ended)
        async with held:
            whole = await _unless_disconnected(request, _whole(first, chunks, shapes))
        if whole is None:
            return self._gone(call)
        return JSONResponse(whole)

    def _stream_ended(
        self, call: Call, held: contextlib.AsyncExitStack
    ) -> Callable[[BaseException | None], Awaitable[dict[str, Any] | None]]:
        """What a stream calls as it ends (once: its response calls it too, for a body
        closed before it ran): give back what it held and record how it ended; for a
        failure, the error body its last event carries."""

        done = False

        async def ended(exc: BaseException | None) -> dict[str, Any] | None:
            nonlocal done
            if done:
                return None
            done = True
            await held.aclose()
            if exc is None:
                self.finished(call, grpc.StatusCode.OK)
            elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                log.info("request.cancelled", request_id=call.id, rpc=call.rpc, status="CANCELLED")
                self.finished(call, grpc.StatusCode.CANCELLED)
            else:
                total_ms = round((time.perf_counter() - call.start) * 1e3, 3)
                code, message, _ = failure_status(exc, call.id, call.rpc, total_ms)
                self.finished(call, code, message)
                return error_body(code, message)
            return None

        return ended


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None once the client disconnects first (`work` is then
    cancelled: a generation aborts, and its KV blocks are freed, within a step)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    working = asyncio.create_task(work)
    watcher = asyncio.create_task(disconnected())
    try:
        await asyncio.wait((working, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not working.done():
            working.cancel()
            await asyncio.wait((working,))
    return None if working.cancelled() else working.result()


async def _whole(
    first: RequestOutput, chunks: AsyncIterator[RequestOutput], shapes: Shapes
) -> dict[str, Any]:
    """A non-streamed answer: every chunk merged."""
    async for chunk in chunks:
        first.merge(chunk)
    counts = usage(first.usage.prompt_tokens, first.usage.completion_tokens) if first.usage else {}
    return shapes.whole(first, counts)
