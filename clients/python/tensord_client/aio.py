"""The asyncio client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any

import grpc
import numpy as np

from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc
from tensord_client._common import (
    DEFAULT_TARGET,
    TLSOptions,
    auth_metadata,
    channel_options,
    generate_request,
    metadata,
    predict_outputs,
    predict_request,
)


async def _chunks(call: Any) -> AsyncIterator[pb.GenerateResponse]:
    try:
        async for chunk in call:
            yield chunk
    finally:
        call.cancel()  # a reader that stops early frees the server's sequence at once


class AsyncClient:
    """The asyncio twin of Client; create and use it inside one event loop.

    Closing it while calls run cancels them: they end with asyncio.CancelledError (the
    sync client's raise grpc.RpcError CANCELLED)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = 30.0,
        tls: TLSOptions | None = None,
        retries: int = 3,
        token: str | None = None,
        round_robin: bool = False,
        options: Iterable[tuple[str, object]] = (),
    ) -> None:
        opts = channel_options(retries, tls, options, round_robin)
        self._channel = (
            grpc.aio.secure_channel(target, tls.credentials(), options=opts)
            if tls is not None
            else grpc.aio.insecure_channel(target, options=opts)
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
        timeout: float | None = None,
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
        timeout: float | None = None,
        request_id: str | None = None,
        typed: bool = False,
    ) -> pb.PredictResponse:
        """Predict, returning the whole response message (version, timing)."""
        request = predict_request(model, inputs, version, outputs, typed)
        response: pb.PredictResponse = await self._stub.Predict(
            request, timeout=self._deadline(timeout), metadata=metadata(request_id, self._auth)
        )
        return response

    def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        token_ids: Iterable[int] | None = None,
        version: int = 0,
        timeout: float | None = None,
        request_id: str | None = None,
        **sampling: Any,
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Stream generated chunks; `sampling` takes SamplingParams fields (max_tokens, ...).

        The call starts here (its deadline counts from now, and bad arguments raise here);
        iterate the result with `async for`."""
        request = generate_request(model, prompt, token_ids, version, sampling)
        call = self._stub.Generate(
            request, timeout=self._deadline(timeout), metadata=metadata(request_id, self._auth)
        )
        return _chunks(call)

    async def health(self, model: str = "", *, timeout: float | None = None) -> pb.HealthResponse:
        """Server and model health."""
        response: pb.HealthResponse = await self._stub.Health(
            pb.HealthRequest(model=model), timeout=self._deadline(timeout), metadata=self._auth
        )
        return response

    async def info(self, *, timeout: float | None = None) -> pb.InfoResponse:
        """Server, devices, providers and models."""
        response: pb.InfoResponse = await self._stub.Info(
            pb.InfoRequest(), timeout=self._deadline(timeout), metadata=self._auth
        )
        return response

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
