"""The blocking client."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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


def _chunks(call: Any) -> Iterator[pb.GenerateResponse]:
    try:
        yield from call
    finally:
        call.cancel()  # a reader that stops early frees the server's sequence at once


class Client:
    """A connection to one tensord (or a load-balanced target list).

    `timeout` is the default deadline in seconds for each call (None: no deadline).
    Calls that fail with UNAVAILABLE are retried up to `retries` times (at most 4, gRPC's
    own limit) by gRPC itself; a Generate stream is retried only before its first chunk.
    `token` is sent as `authorization: Bearer <token>` on every call. With
    `round_robin=True` and a target such as `ipv4:10.0.0.1:50051,10.0.0.2:50051` (or a DNS
    name with several addresses), calls are spread over every daemon and those not
    reporting SERVING on grpc.health.v1 are skipped (gRPC's health checks carry no
    token: the daemons must keep `[auth] open_health = true`, the default).
    Errors surface as grpc.RpcError with the server's status code and message;
    `tensord_client.retry_after(error)` gives a rate limit's wait in seconds. An array
    whose dtype the contract cannot carry raises ValueError before anything is sent.
    """

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
            grpc.secure_channel(target, tls.credentials(), options=opts)
            if tls is not None
            else grpc.insecure_channel(target, options=opts)
        )
        self._stub = pb_grpc.InferenceServiceStub(self._channel)
        self.timeout = timeout
        self._auth = auth_metadata(token)

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def predict(
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
            self.predict_response(
                model,
                inputs,
                version=version,
                outputs=outputs,
                timeout=timeout,
                request_id=request_id,
            )
        )

    def predict_response(
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
        response: pb.PredictResponse = self._stub.Predict(
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
    ) -> Iterator[pb.GenerateResponse]:
        """Stream generated chunks; `sampling` takes SamplingParams fields (max_tokens, ...).

        The call starts here (its deadline counts from now, and bad arguments raise here).
        Stopping the iteration early, or closing or dropping the iterator, cancels it."""
        request = generate_request(model, prompt, token_ids, version, sampling)
        call = self._stub.Generate(
            request, timeout=self._deadline(timeout), metadata=metadata(request_id, self._auth)
        )
        return _chunks(call)

    def health(self, model: str = "", *, timeout: float | None = None) -> pb.HealthResponse:
        """Server and model health."""
        response: pb.HealthResponse = self._stub.Health(
            pb.HealthRequest(model=model), timeout=self._deadline(timeout), metadata=self._auth
        )
        return response

    def info(self, *, timeout: float | None = None) -> pb.InfoResponse:
        """Server, devices, providers and models."""
        response: pb.InfoResponse = self._stub.Info(
            pb.InfoRequest(), timeout=self._deadline(timeout), metadata=self._auth
        )
        return response

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
