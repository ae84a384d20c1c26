"""Seeded mutation fuzzing of the daemon's inputs: request messages, HTTP/2 frames and
OpenAI request bodies.

`mutate` takes a valid serialized request and breaks it the ways corrupted or hostile bytes
break (bit flips, truncation, insertion, deletion, duplication, splicing, huge varints,
field numbers and wire types that do not belong); `random_frames` makes HTTP/2 traffic that
a gRPC client never sends. Every choice comes from one numpy Generator, so a failure is
reproduced from its seed and index. Used by tests/e2e/test_fuzz.py (bounded in time for
`make test`; `make bench` runs it longer).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import grpc
import numpy as np

from tensord.v1 import inference_pb2 as pb

CALLER_MISTAKES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""What a request of the caller's making may get (the error table); UNKNOWN, INTERNAL and
UNIMPLEMENTED would be the daemon's fault."""

PREDICT = "/tensord.v1.InferenceService/Predict"
GENERATE = "/tensord.v1.InferenceService/Generate"
HEALTH = "/tensord.v1.InferenceService/Health"
INFO = "/tensord.v1.InferenceService/Info"


def seeds() -> list[tuple[str, bytes]]:
    """Valid requests to start from: (method, serialized message)."""
    x = np.linspace(-1, 1, 2 * 512, dtype=np.float32).reshape(2, 512)
    raw = pb.PredictRequest(model="mlp", output_names=["output"])
    raw.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=x.shape, raw_data=x.tobytes())
    typed = pb.PredictRequest(model="mlp", version=1)
    tensor = typed.inputs.add(name="input", dtype=pb.DATA_TYPE_FLOAT32, shape=(1, 512))
    tensor.contents.float_values.extend(x[0].tolist())
    image = pb.PredictRequest(model="cnn")
    pixels = np.arange(3 * 32 * 32, dtype=np.uint8)
    image.inputs.add(
        name="image", dtype=pb.DATA_TYPE_UINT8, shape=(1, 3, 32, 32)
    ).raw_data = pixels.tobytes()
    text = pb.GenerateRequest(model="tinylm", prompt="Once upon a time")
    text.sampling.max_tokens = 4
    text.sampling.temperature = 0.7
    text.sampling.seed = 3
    text.sampling.stop.append("\n")
    ids = pb.GenerateRequest(model="tinylm", prompt_token_ids=[1, 45, 300, 9])
    ids.sampling.max_tokens = 3
    ids.sampling.stop_token_ids.extend([2, 5])
    ids.sampling.logprobs = 2
    return [
        (PREDICT, raw.SerializeToString()),
        (PREDICT, typed.SerializeToString()),
        (PREDICT, image.SerializeToString()),
        (GENERATE, text.SerializeToString()),
        (GENERATE, ids.SerializeToString()),
        (HEALTH, pb.HealthRequest(model="mlp").SerializeToString()),
        (INFO, b""),
    ]


def varint(n: int) -> bytes:
    """An unsigned varint's bytes."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes | int) -> bytes:
    """A length-delimited field, or a varint field for an int."""
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _flip(rng: np.random.Generator, data: bytearray) -> None:
    for _ in range(1 + int(rng.integers(8))):
        i = int(rng.integers(len(data)))
        data[i] ^= 1 << int(rng.integers(8))


def _byte(rng: np.random.Generator, data: bytearray) -> None:
    i = int(rng.integers(len(data)))
    data[i] = int(rng.choice([0x00, 0x7F, 0x80, 0xFF, int(rng.integers(256))]))


def _truncate(rng: np.random.Generator, data: bytearray) -> None:
    del data[int(rng.integers(len(data))) :]


def _delete(rng: np.random.Generator, data: bytearray) -> None:
    i = int(rng.integers(len(data)))
    del data[i : i + 1 + int(rng.integers(16))]


def _insert(rng: np.random.Generator, data: bytearray) -> None:
    i = int(rng.integers(len(data) + 1))
    data[i:i] = rng.bytes(1 + int(rng.integers(32)))


def _duplicate(rng: np.random.Generator, data: bytearray) -> None:
    i = int(rng.integers(len(data)))
    chunk = data[i : i + 1 + int(rng.integers(64))]
    data[i:i] = chunk * (1 + int(rng.integers(64)))


def _field(rng: np.random.Generator, data: bytearray) -> None:
    """A field that does not belong: an odd number and wire type, a huge varint or length."""
    number = int(rng.choice([1, 2, 3, 4, 5, 6, 15, 16, 2047, 536870911]))
    wire = int(rng.integers(8))
    value = varint(int(rng.choice([0, 1, 127, 128, 2**31, 2**63, 2**64 - 1])))
    i = int(rng.integers(len(data) + 1))
    data[i:i] = varint(number << 3 | wire) + value + rng.bytes(int(rng.integers(8)))


def _splice(rng: np.random.Generator, data: bytearray, other: bytes) -> None:
    i, j = int(rng.integers(len(data) + 1)), int(rng.integers(len(other) + 1))
    data[i:] = other[j:]


_MUTATIONS: list[Callable[[np.random.Generator, bytearray], None]] = [
    _flip, _byte, _truncate, _delete, _insert, _duplicate, _field,
]  # fmt: skip


def mutate(rng: np.random.Generator, message: bytes, other: bytes) -> bytes:
    """`message` after one to four random mutations (`other` may be spliced in)."""
    data = bytearray(message or b"\0")
    for _ in range(1 + int(rng.integers(4))):
        if not data:
            data = bytearray(b"\0")
        if rng.random() < 0.1:
            _splice(rng, data, other)
        else:
            _MUTATIONS[int(rng.integers(len(_MUTATIONS)))](rng, data)
    return bytes(data)


def grpc_frame(rng: np.random.Generator, message: bytes) -> bytes:
    """A gRPC length-prefixed message, its prefix sometimes lying."""
    flag = 0 if rng.random() < 0.9 else int(rng.integers(256))
    length = len(message)
    if rng.random() < 0.2:
        length = int(rng.choice([0, length + 1, max(0, length - 1), 2**31 - 1, 2**32 - 1]))
    return bytes([flag]) + struct.pack(">I", length) + message


def random_frames(rng: np.random.Generator, count: int) -> bytes:
    """HTTP/2 frames of random types, flags, streams and payloads, after the preface."""
    out = bytearray()
    for _ in range(count):
        kind = int(rng.integers(12))  # 0-9 are defined frame types, 10 and 11 are not
        flags = int(rng.integers(256))
        stream = int(rng.choice([0, 1, 3, 2, 2**31 - 1]))
        payload = rng.bytes(int(rng.choice([0, 1, 4, 8, 9, 64, 300])))
        out += len(payload).to_bytes(3, "big") + bytes([kind, flags])
        out += stream.to_bytes(4, "big") + payload
    return bytes(out)


OPENAI_REQUESTS: dict[str, dict[str, object]] = {
    "/v1/completions": {"model": "tinylm", "prompt": "Hello there", "max_tokens": 4},
    "/v1/chat/completions": {
        "model": "tinylm",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 4,
    },
}
"""Valid OpenAI requests to spoil, by path."""
_OPENAI_FIELDS = (
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "seed",
    "n", "repetition_penalty", "ignore_eos", "echo", "response_format", "tools", "whatever",
)  # fmt: skip


def _spoiled_value(rng: np.random.Generator) -> object:
    """A JSON value a field should not hold (or, now and then, one it may)."""
    choices: list[Callable[[], object]] = [
        lambda: None, lambda: True, lambda: -1, lambda: 0, lambda: 2**64, lambda: 1.5,
        lambda: float("nan"), lambda: float("inf"), lambda: "", lambda: "\ud800x",
        lambda: "x" * int(rng.choice([1, 100, 100_000, 1_500_000])),
        lambda: [], lambda: [1, "a"], lambda: [True, False], lambda: [[1, 2], [3]],
        lambda: {"role": "user"}, lambda: [{"role": "user", "content": ["x"]}],
        lambda: [{"role": "user", "content": [{"type": "image_url"}]}],
        lambda: [int(v) for v in rng.integers(-5, 70_000, int(rng.choice([1, 50, 200_000])))],
        lambda: [{"role": "user", "content": "hi"}] * int(rng.choice([1, 5000])),
        lambda: {"include_usage": "yes"}, lambda: ["stop"] * 40, lambda: 4,
    ]  # fmt: skip
    return choices[int(rng.integers(len(choices)))]()


def openai_request(rng: np.random.Generator) -> tuple[str, bytes]:
    """(path, body): a valid OpenAI request with one to three fields spoiled, or now and
    then a body that is no request at all (not JSON, not an object, nested too deep)."""
    path = list(OPENAI_REQUESTS)[int(rng.integers(len(OPENAI_REQUESTS)))]
    roll = rng.random()
    if roll < 0.04:
        return path, rng.bytes(int(rng.integers(1, 300)))
    if roll < 0.07:
        return path, b"[" * 100_000 + b"]" * 100_000
    if roll < 0.1:
        return path, b'{"model": "tinylm", "prompt": "unterminated'
    if roll < 0.12:  # an integer past Python's 4300-digit conversion limit
        return path, b'{"model": "tinylm", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
    body = dict(OPENAI_REQUESTS[path])
    for _ in range(1 + int(rng.integers(3))):
        name = _OPENAI_FIELDS[int(rng.integers(len(_OPENAI_FIELDS)))]
        if rng.random() < 0.05:
            name = "\ud800" + name  # a field name JSON can carry and UTF-8 cannot
        body[name] = _spoiled_value(rng)
    return path, json.dumps(body).encode()  # NaN and Infinity as Python writes them
