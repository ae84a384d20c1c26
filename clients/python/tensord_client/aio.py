"""The asyncio client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np

from tensord_client._common import (
    TLSOptions,
    auth_metadata,
    channel_options,
    default_target,
    embed_request,
    embed_vectors,
    generate_request,
    metadata,
    predict_outputs,
    predict_request,
)
from tensord_client.errors import from_rpc_error
from tensord_client.results import GenerateChunk, Health, Info, ModelIndex
from tensord_client.v1 import inference_pb2 as pb
from tensord_client.v1 import inference_pb2_grpc as pb_grpc

Reply = TypeVar("Reply")


async def _unary(method: Callable[..., Awaitable[Reply]], request: Any, **kwargs: Any) -> Reply:
    """Await a unary method; a failure raises its typed error (tensord_client.errors)."""
    try:
        return await method(request, **kwargs)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


async def _chunks(call: Any) -> AsyncIterator[GenerateChunk]:
    try:
        async for response in call:
            yield GenerateChunk.from_proto(response)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()  # a reader that stops early frees the server's sequence at once


class AsyncClient:
    """The asyncio twin of Client (same arguments, same replies, same typed errors); create
    and use it inside one event loop.

    Closing it while calls run cancels them: they end with asyncio.CancelledError (the
    sync client's raise tensord_client.Cancelled)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        timeout: float | None = 30.0,
        tls: TLSOptions | None = None,
        retries: int = 3,
        token: str | None = None,
        round_robin: bool = False,
        options: Iterable[tuple[str, object]] = (),
    ) -> None:
        self.target = target or default_target()
        opts = channel_options(retries, tls, options, round_robin)
        self._channel = (
            grpc.aio.secure_channel(self.target, tls.credentials(), options=opts)
            if tls is not None
            else grpc.aio.insecure_channel(self.target, options=opts)
        )
        self._stub = pb_grpc.InferenceServiceStub(self._channel)
        self.timeout = timeout
        self._auth = auth_metadata(token)

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    async def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int = 0,
        outputs: Iterable[str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
        request_id: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `model` on named arrays; returns the named output arrays."""
        return predict_outputs(
            await self.predict_response(
                model,
                inputs,
                version=version,
                outputs=outputs,
                timeout=timeout,
                request_id=request_id,
            )
        )

    async def predict_response(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int = 0,
        outputs: Iterable[str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
        request_id: str | None = None,
        typed: bool = False,
    ) -> pb.PredictResponse:
        """Predict, returning the whole response message (version, timing)."""
        request = predict_request(model, inputs, version, outputs, typed)
        response: pb.PredictResponse = await _unary(
            self._stub.Predict,
            request,
            timeout=self._deadline(timeout),
            metadata=metadata(request_id, self._auth),
        )
        return response

    async def embed(
        self,
        model: str,
        texts: str | Iterable[str] | None = None,
        *,
        token_ids: Iterable[Iterable[int]] | None = None,
        version: int = 0,
        truncate: bool = True,
        dimensions: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
        request_id: str | None = None,
    ) -> np.ndarray:
        """One vector per text (or per list of token ids) from an embedding model, float32
        [inputs, dimensions]. A text longer than the model takes is cut (`truncate=False`:
        refused); `dimensions` keeps the first values (normalised again when the
        model normalises)."""
        request = embed_request(model, texts, token_ids, version, truncate, dimensions)
        response: pb.EmbedResponse = await _unary(
            self._stub.Embed,
            request,
            timeout=self._deadline(timeout),
            metadata=metadata(request_id, self._auth),
        )
        return embed_vectors(response)

    def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        token_ids: Iterable[int] | None = None,
        version: int = 0,
        timeout: float | None = None,
        request_id: str | None = None,
        priority: int = 0,
        **sampling: Any,
    ) -> AsyncIterator[GenerateChunk]:
        """Stream generated chunks; `sampling` takes SamplingParams fields (max_tokens, ...).

        The call starts here (its deadline counts from now, and bad arguments raise here);
        iterate the result with `async for`."""
        request = generate_request(model, prompt, token_ids, version, sampling, priority)
        call = self._stub.Generate(
            request, timeout=self._deadline(timeout), metadata=metadata(request_id, self._auth)
        )
        return _chunks(call)

    async def repository_index(
        self,
        *,
        ready: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
    ) -> list[ModelIndex]:
        """Every model of the repository: each loaded version's state, and the models not
        loaded (version 0, NOT_LOADED); only the READY versions with `ready`."""
        reply: pb.RepositoryIndexResponse = await _unary(
            self._stub.RepositoryIndex,
            pb.RepositoryIndexRequest(ready=ready),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return [ModelIndex.from_proto(m) for m in reply.models]

    async def load_model(
        self,
        model: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
    ) -> None:
        """Load (or load again, if its files changed) a model of the repository; returns
        once it is READY ([server] model_control = "explicit")."""
        await _unary(
            self._stub.LoadModel,
            pb.LoadModelRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )

    async def unload_model(
        self,
        model: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
    ) -> bool:
        """Unload a model; returns once its calls have ended and it is freed (False when
        it was not loaded)."""
        reply: pb.UnloadModelResponse = await _unary(
            self._stub.UnloadModel,
            pb.UnloadModelRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return reply.unloaded

    async def health(
        self,
        model: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
    ) -> Health:
        """Server and model health."""
        reply: pb.HealthResponse = await _unary(
            self._stub.Health,
            pb.HealthRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return Health.from_proto(reply)

    async def info(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's gRPC deadline; public API
    ) -> Info:
        """Server, devices, providers and models."""
        reply: pb.InfoResponse = await _unary(
            self._stub.Info, pb.InfoRequest(), timeout=self._deadline(timeout), metadata=self._auth
        )
        return Info.from_proto(reply)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
