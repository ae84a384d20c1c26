"""The blocking client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc
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


def _unary(method: Callable[..., Reply], request: Any, **kwargs: Any) -> Reply:
    """Call a unary method; a failure raises its typed error (tensord_client.errors)."""
    try:
        return method(request, **kwargs)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def _chunks(call: Any) -> Iterator[GenerateChunk]:
    try:
        for response in call:
            yield GenerateChunk.from_proto(response)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()  # a reader that stops early frees the server's sequence at once


class Client:
    """A connection to one tensord (or a load-balanced target list).

    `target` is HOST:PORT (any gRPC target); left out, it is $TENSORD_TARGET, else
    127.0.0.1:50051. `timeout` is the default deadline in seconds for each call (None: no
    deadline). Calls that fail with UNAVAILABLE are retried up to `retries` times (at most
    4, gRPC's own limit) by gRPC itself; a Generate stream is retried only before its first
    chunk. `token` is sent as `authorization: Bearer <token>` on every call. With
    `round_robin=True` and a target such as `ipv4:10.0.0.1:50051,10.0.0.2:50051` (or a DNS
    name with several addresses), calls are spread over every daemon and those not
    reporting SERVING on grpc.health.v1 are skipped (gRPC's health checks carry no
    token: the daemons must keep `[auth] open_health = true`, the default).

    A failed call raises the tensord_client.errors class of its status (NotFound,
    InvalidArgument, Unavailable, ResourceExhausted with `retry_after`, ...), all of them
    TensordError and grpc.RpcError. An array whose dtype the contract cannot carry raises
    ValueError before anything is sent.
    """

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
            grpc.secure_channel(self.target, tls.credentials(), options=opts)
            if tls is not None
            else grpc.insecure_channel(self.target, options=opts)
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
        """Predict, returning the whole response message (version, timing);
        `tensord_client.predict_outputs(reply)` decodes its tensors."""
        request = predict_request(model, inputs, version, outputs, typed)
        response: pb.PredictResponse = _unary(
            self._stub.Predict,
            request,
            timeout=self._deadline(timeout),
            metadata=metadata(request_id, self._auth),
        )
        return response

    def embed(
        self,
        model: str,
        texts: str | Iterable[str] | None = None,
        *,
        token_ids: Iterable[Iterable[int]] | None = None,
        version: int = 0,
        truncate: bool = True,
        dimensions: int = 0,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> np.ndarray:
        """One vector per text (or per list of token ids) from an embedding model, float32
        [inputs, dimensions]. A text longer than the model takes is cut (`truncate=False`:
        refused); `dimensions` keeps the first values (normalised again when the
        model normalises)."""
        request = embed_request(model, texts, token_ids, version, truncate, dimensions)
        response: pb.EmbedResponse = _unary(
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
    ) -> Iterator[GenerateChunk]:
        """Stream generated chunks; `sampling` takes SamplingParams fields (max_tokens, ...).

        The call starts here (its deadline counts from now, and bad arguments raise here).
        Stopping the iteration early, or closing or dropping the iterator, cancels it.
        The last chunk carries `finish_reason` ("STOP" or "LENGTH") and `usage`; a stream
        that fails part-way raises its typed error after the chunks already received."""
        request = generate_request(model, prompt, token_ids, version, sampling, priority)
        call = self._stub.Generate(
            request, timeout=self._deadline(timeout), metadata=metadata(request_id, self._auth)
        )
        return _chunks(call)

    def repository_index(
        self, *, ready: bool = False, timeout: float | None = None
    ) -> list[ModelIndex]:
        """Every model of the repository: each loaded version's state, and the models not
        loaded (version 0, NOT_LOADED); only the READY versions with `ready`."""
        reply: pb.RepositoryIndexResponse = _unary(
            self._stub.RepositoryIndex,
            pb.RepositoryIndexRequest(ready=ready),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return [ModelIndex.from_proto(m) for m in reply.models]

    def load_model(self, model: str, *, timeout: float | None = None) -> None:
        """Load (or load again, if its files changed) a model of the repository; returns
        once it is READY ([server] model_control = "explicit")."""
        _unary(
            self._stub.LoadModel,
            pb.LoadModelRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )

    def unload_model(self, model: str, *, timeout: float | None = None) -> bool:
        """Unload a model; returns once its calls have ended and it is freed (False when
        it was not loaded)."""
        reply: pb.UnloadModelResponse = _unary(
            self._stub.UnloadModel,
            pb.UnloadModelRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return reply.unloaded

    def health(self, model: str = "", *, timeout: float | None = None) -> Health:
        """Server and model health: `status` "SERVING" or "NOT_SERVING", each model
        version's `state` ("READY", "LOADING", "FAILED", ...)."""
        reply: pb.HealthResponse = _unary(
            self._stub.Health,
            pb.HealthRequest(model=model),
            timeout=self._deadline(timeout),
            metadata=self._auth,
        )
        return Health.from_proto(reply)

    def info(self, *, timeout: float | None = None) -> Info:
        """Server, devices, providers and models."""
        reply: pb.InfoResponse = _unary(
            self._stub.Info, pb.InfoRequest(), timeout=self._deadline(timeout), metadata=self._auth
        )
        return Info.from_proto(reply)

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
