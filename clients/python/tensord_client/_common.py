"""What the sync and asyncio clients share: channel set-up, request building, decoding."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from tensord_client.errors import retry_after
from tensord_client.tensors import decode_tensor, encode_tensor
from tensord_client.v1 import inference_pb2 as pb

__all__ = ["DEFAULT_TARGET", "TARGET_ENV", "TLSOptions", "default_target", "retry_after"]

SERVICE = "tensord.v1.InferenceService"
DEFAULT_TARGET = "127.0.0.1:50051"
TARGET_ENV = "TENSORD_TARGET"
"""The environment variable that names the target when a caller gives none."""


def default_target() -> str:
    """$TENSORD_TARGET when it is set and not empty, else 127.0.0.1:50051."""
    return os.environ.get(TARGET_ENV) or DEFAULT_TARGET


@dataclass(slots=True, frozen=True)
class TLSOptions:
    """TLS for the channel; give a client certificate and key for mutual TLS.

    Each value is PEM bytes or a path to a PEM file.
    """

    root_certificates: bytes | str | Path | None = None
    certificate_chain: bytes | str | Path | None = None
    private_key: bytes | str | Path | None = None
    server_name_override: str | None = None

    def __post_init__(self) -> None:
        # gRPC's core aborts the process on a certificate without its key (or the reverse).
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError(
                "TLSOptions: certificate_chain and private_key go together (mutual TLS)"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from these options."""
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.root_certificates),
            private_key=_pem(self.private_key),
            certificate_chain=_pem(self.certificate_chain),
        )


def _pem(value: bytes | str | Path | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def service_config(retries: int, round_robin: bool) -> dict[str, Any]:
    """gRPC service config: retries on UNAVAILABLE; with round_robin, spread calls over every
    address of the target and skip those whose grpc.health.v1 status is not SERVING."""
    config: dict[str, Any] = {}
    if retries > 0:
        config["methodConfig"] = [
            {
                "name": [{"service": SERVICE}],
                "retryPolicy": {
                    "maxAttempts": min(retries + 1, 5),
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    if round_robin:
        config["loadBalancingConfig"] = [{"round_robin": {}}]
        config["healthCheckConfig"] = {"serviceName": SERVICE}
    return config


def channel_options(
    retries: int,
    tls: TLSOptions | None,
    extra: Iterable[tuple[str, object]],
    round_robin: bool = False,
) -> list[tuple[str, object]]:
    """Channel options: gRPC's own retry policy on UNAVAILABLE, load balancing, message
    limits, TLS override."""
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.enable_retries", 1 if retries > 0 else 0),
        # gRPC retries only calls whose request fits its retry buffer (256 KiB by default):
        # room for large batches too.
        ("grpc.per_rpc_retry_buffer_size", 64 * 1024 * 1024),
        ("grpc.retry_buffer_size", 256 * 1024 * 1024),
        # Its own connections: gRPC shares them between channels of the same target and
        # options, so a new client would inherit one waiting out its reconnect backoff (a
        # server restarted on the same port refused its first call as down).
        ("grpc.use_local_subchannel_pool", 1),
    ]
    config = service_config(retries, round_robin)
    if config:
        options.append(("grpc.service_config", json.dumps(config)))
    if tls is not None and tls.server_name_override:
        options.append(("grpc.ssl_target_name_override", tls.server_name_override))
    options.extend(extra)
    return options


def predict_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    version: int,
    outputs: Iterable[str] | None,
    typed: bool,
) -> pb.PredictRequest:
    """A PredictRequest; raw bytes by default, typed contents with typed=True.

    An array the contract cannot carry (a dtype such as uint16 or complex) raises ValueError
    before anything is sent.
    """
    tensors = [encode_tensor(name, array, contents=typed) for name, array in inputs.items()]
    return pb.PredictRequest(
        model=model, version=version, inputs=tensors, output_names=list(outputs or ())
    )


def predict_outputs(response: pb.PredictResponse) -> dict[str, np.ndarray]:
    """The response's tensors as arrays, by name."""
    return {t.name: decode_tensor(t) for t in response.outputs}


def constraint_message(constraint: Mapping[str, Any]) -> pb.Constraint:
    """A Constraint from one key: `json_schema` (a schema as a dict or JSON text),
    `json_object` (True), `regex`, `choice` (a list of strings) or `grammar` (Lark)."""
    if len(constraint) != 1:
        raise ValueError(
            "a constraint has one key: json_schema, json_object, regex, choice or grammar"
        )
    ((kind, value),) = constraint.items()
    if kind == "json_schema" and not isinstance(value, str):
        value = json.dumps(value)
    if kind == "choice":
        if isinstance(value, str):
            raise ValueError("choice takes a list of strings, not one string")
        return pb.Constraint(choice=pb.Choices(choices=list(value)))
    return pb.Constraint(**{kind: value})


def embed_request(
    model: str,
    texts: str | Iterable[str] | None,
    token_ids: Iterable[Iterable[int]] | None,
    version: int,
    truncate: bool,
    dimensions: int,
) -> pb.EmbedRequest:
    """An EmbedRequest of texts (a string is one text) or of token-id lists."""
    if (texts is None) == (token_ids is None):
        raise ValueError("give texts or token_ids, not both and not neither")
    request = pb.EmbedRequest(
        model=model, version=version, truncate=truncate, dimensions=dimensions
    )
    if texts is not None:
        request.texts.extend([texts] if isinstance(texts, str) else texts)
    else:
        assert token_ids is not None
        for ids in token_ids:
            request.token_ids.add().ids.extend(ids)
    return request


def embed_vectors(response: pb.EmbedResponse) -> np.ndarray:
    """An EmbedResponse's vectors as float32 [inputs, dimensions]."""
    return np.array([e.values for e in response.embeddings], dtype=np.float32)


def generate_request(
    model: str,
    prompt: str | None,
    token_ids: Iterable[int] | None,
    version: int,
    sampling: Mapping[str, Any],
    priority: int = 0,
) -> pb.GenerateRequest:
    """A GenerateRequest; sampling keys are SamplingParams field names, None means unset.
    `priority`: lower runs first (and may preempt higher values when the model is full).

    `stop` and `stop_token_ids` take one value or a list; token ids may be any iterable of
    integers, a NumPy array included.
    """
    fields = {k: v for k, v in sampling.items() if v is not None}
    if isinstance(fields.get("stop"), str):
        fields["stop"] = [fields["stop"]]  # one stop sequence, not one per character
    if isinstance(fields.get("stop_token_ids"), int | np.integer):
        fields["stop_token_ids"] = [fields["stop_token_ids"]]
    if "stop_token_ids" in fields:
        fields["stop_token_ids"] = [int(t) for t in fields["stop_token_ids"]]
    if isinstance(fields.get("constraint"), Mapping):
        fields["constraint"] = constraint_message(fields["constraint"])
    return pb.GenerateRequest(
        model=model,
        version=version,
        prompt=prompt or "",
        prompt_token_ids=[int(t) for t in token_ids] if token_ids is not None else [],
        sampling=pb.SamplingParams(**fields),
        priority=priority,
    )


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """`authorization: Bearer <token>` when a token is given."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def metadata(
    request_id: str | None, base: tuple[tuple[str, str], ...] = ()
) -> tuple[tuple[str, str], ...]:
    """Call metadata: `base` (the credentials) and an x-request-id when one is given."""
    return (*base, ("x-request-id", request_id)) if request_id else base
