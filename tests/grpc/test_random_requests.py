"""Seeded random requests, valid and not, against real servers: every answer is OK or a
status from the error table with a message (never UNKNOWN or INTERNAL), and afterwards the
daemon still serves, with no run, pool buffer or KV block left behind."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tensord.dtypes import DType
from tensord.server.tensord_v1.codec import encode_tensor
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc
from tensord_client import Client
from tests.conftest import ServerThread, start_server, wait_generator_idle
from tests.fuzzing import CALLER_MISTAKES
from tests.models import small_generator

Code = grpc.StatusCode
PREDICT_CODES = CALLER_MISTAKES | {Code.DEADLINE_EXCEEDED}
"""The repository's broken model answers FAILED_PRECONDITION (final: clients do not retry
it); nothing answers UNAVAILABLE while the server runs."""
GENERATE_CODES = CALLER_MISTAKES
JUNK_NAMES = ["", "nope", "ü∂", "x" * 300, "../mlp", "mlp ", "\x00", "input\n"]
DIMS = [-7, -1, 0, 1, 2, 3, 10, 512, 2**31, 2**62]


def _pick(rng: np.random.Generator, values: list[Any]) -> Any:
    return values[int(rng.integers(len(values)))]


def _random_tensor(rng: np.random.Generator, names: list[str]) -> pb.Tensor:
    """A tensor whose name, dtype, shape and data each may or may not fit a model."""
    shape = [int(_pick(rng, DIMS)) for _ in range(int(rng.integers(0, 5)))]
    if rng.random() < 0.5 and names:  # mostly the model's own shape
        shape = [1 + int(rng.integers(3)), 512] if rng.random() < 0.5 else [1, 3, 32, 32]
    tensor = pb.Tensor(
        name=_pick(rng, names + JUNK_NAMES),
        dtype=int(rng.integers(-1, 14)),  # proto3 enums are open: unknown numbers arrive too
        shape=shape,
    )
    elements = math.prod(shape) if all(0 <= d <= 4096 for d in shape) else 1
    kind = rng.random()
    if kind < 0.45:  # raw bytes, the right length for float32 or a little off
        size = 4 * elements + int(_pick(rng, [0, 0, 0, -1, 1, 4, -4]))
        tensor.raw_data = rng.bytes(max(0, min(size, 1 << 20)))
    elif kind < 0.85:  # typed contents of some type, some count
        count = min(elements + int(_pick(rng, [0, 0, 1, -1])), 1 << 16)
        count = max(0, count)
        fields = ["float_values", "double_values", "int_values", "int64_values"]
        field = _pick(rng, [*fields, "bool_values", "bytes_values"])
        values: list[Any]
        if field in ("float_values", "double_values"):
            values = rng.normal(size=count).tolist()
            if count and rng.random() < 0.3:
                values[0] = _pick(rng, [math.nan, math.inf, -math.inf, 1e300])
        elif field == "int_values":
            values = rng.integers(-(2**31), 2**31, count).tolist()
        elif field == "int64_values":
            values = rng.integers(-(2**63), 2**63 - 1, count).tolist()
        elif field == "bool_values":
            values = (rng.random(count) < 0.5).tolist()
        else:
            values = [rng.bytes(int(rng.integers(0, 8))) for _ in range(count)]
        getattr(tensor.contents, field).extend(values)
    return tensor  # else neither raw bytes nor contents


def _valid_predict(rng: np.random.Generator, model: pb.ModelInfo) -> pb.PredictRequest:
    """A request the model takes: every input at its dtype, a batch of 1 to 3 where the
    first dimension is free, other free dimensions 1."""
    request = pb.PredictRequest(model=model.name)
    batch = 1 + int(rng.integers(3))
    for spec in model.inputs:
        shape = [
            batch if i == 0 and d == -1 else (d if d >= 0 else 1) for i, d in enumerate(spec.shape)
        ]
        dtype = DType(spec.dtype)
        if dtype is DType.STRING:
            array = np.full(shape, "x", dtype=object)
        else:
            array = rng.integers(0, 2, size=shape).astype(dtype.numpy)
        request.inputs.append(encode_tensor(spec.name, array))
    return request


def _mutate(rng: np.random.Generator, request: pb.PredictRequest) -> None:
    """Spoil one thing about a request: a name, a dtype, a shape, the data, the outputs."""
    what = int(rng.integers(9))
    tensor = request.inputs[int(rng.integers(len(request.inputs)))] if request.inputs else None
    if what == 0:
        request.model = _pick(rng, JUNK_NAMES)
    elif what == 1:
        request.version = int(_pick(rng, [2, -1, 7, 2**40]))
    elif what == 2:
        request.inputs.append(_random_tensor(rng, [t.name for t in request.inputs]))
    elif what == 3 and tensor is not None:
        request.inputs.remove(tensor)
    elif what == 4 and tensor is not None:
        tensor.dtype = int(rng.integers(-1, 14))  # type: ignore[assignment]
    elif what == 5 and tensor is not None and tensor.shape:
        tensor.shape[int(rng.integers(len(tensor.shape)))] = int(_pick(rng, DIMS))
    elif what == 6 and tensor is not None:
        tensor.CopyFrom(_random_tensor(rng, [tensor.name]))
    elif what == 7:
        request.output_names.append(_pick(rng, ["output", "probs", "y", *JUNK_NAMES]))
    else:
        request.output_encoding = int(_pick(rng, [1, 2, 3, -1]))  # type: ignore[assignment]


def _random_predict(rng: np.random.Generator, models: list[pb.ModelInfo]) -> bytes:
    if rng.random() < 0.05:  # bytes that are no PredictRequest at all
        return rng.bytes(int(rng.integers(1, 64)))
    request = _valid_predict(rng, _pick(rng, models))
    for _ in range(int(_pick(rng, [0, 0, 1, 1, 1, 2]))):
        _mutate(rng, request)
    return request.SerializeToString()


def _call(channel: grpc.Channel, method: str, data: bytes) -> tuple[Code, str]:
    call = channel.unary_unary(method)  # bytes in, bytes out: the request may be malformed
    try:
        call(data, timeout=20)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return Code.OK, ""


def _tally(answers: list[tuple[Code, str]], allowed: set[Code], sent: list[Any]) -> Counter[Code]:
    """Answers per status; each must be an allowed one, and a refusal must say why (and not
    be an internal error). `sent[i]` is shown when answer i fails that."""
    seen: Counter[Code] = Counter()
    for what, (code, details) in zip(sent, answers, strict=True):
        seen[code] += 1
        assert code in allowed, (code, details, what)
        if code is not Code.OK:
            assert details and "internal error" not in details, (code, details)
    return seen


def _still_held(stub: pb_grpc.InferenceServiceStub) -> list[str]:
    """What any model still holds: queued or running batches, host or device buffers."""
    held = []
    for model in stub.Info(pb.InfoRequest(), timeout=10).models:
        status = model.executor_status
        if status.queue_depth or status.running:
            held.append(f"{model.name}: {status.queue_depth} queued, {status.running} running")
        held += [
            f"{model.name}: {p.name} {p.in_use_bytes} B" for p in status.pools if p.in_use_bytes
        ]
    return held


def test_random_predict_requests_get_table_statuses_and_leave_nothing_behind(
    server: ServerThread,
) -> None:
    rng = np.random.default_rng(20261122)
    method = "/tensord.v1.InferenceService/Predict"
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        models = [
            m
            for m in stub.Info(pb.InfoRequest(), timeout=10).models
            if m.name != "slow"  # runs for seconds by design
        ]
        requests = [_random_predict(rng, models) for _ in range(400)]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda data: _call(channel, method, data), requests))
        seen = _tally(answers, PREDICT_CODES, [data[:300] for data in requests])
        # The mix reaches past the first checks: some requests are served, most refused.
        assert seen.get(Code.OK, 0) >= 50 and seen.get(Code.INVALID_ARGUMENT, 0) >= 100, seen
        good = pb.PredictRequest(model="mlp")
        good.inputs.add(
            name="input",
            dtype=pb.DATA_TYPE_FLOAT32,
            shape=[1, 512],
            raw_data=np.ones((1, 512), np.float32).tobytes(),
        )
        assert list(stub.Predict(good, timeout=30).outputs[0].shape) == [1, 10]
        for name in JUNK_NAMES:  # Health for a model that is not there: NOT_FOUND, named
            code, details = _call(
                channel,
                "/tensord.v1.InferenceService/Health",
                pb.HealthRequest(model=name).SerializeToString(),
            )
            assert code in {Code.OK, Code.NOT_FOUND}, (name, code, details)
        assert _still_held(stub) == []


# --- Generate ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_server(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = small_generator(demo_repo, tmp_path_factory.mktemp("random-generate-repo"))
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    srv = start_server(root)
    yield srv
    srv.stop()


SAMPLING_VALUES: dict[str, list[Any]] = {
    "max_tokens": [-1, 0, 1, 3, 8, 10**9],
    "temperature": [-1.0, 0.0, 0.7, math.nan, math.inf, 1e30],
    "top_k": [-1, 0, 1, 50, 10**9],
    "top_p": [-0.1, 0.0, 0.5, 1.0, 1.5, math.nan],
    "repetition_penalty": [-1.0, 0.0, 1.0, 1.2, math.nan, math.inf],
    "seed": [0, 7, 2**64 - 1],
    "logprobs": [-1, 0, 1, 5, 10**6],
}


def _valid_generate(rng: np.random.Generator) -> pb.GenerateRequest:
    request = pb.GenerateRequest(model="tinylm")
    if rng.random() < 0.5:
        request.prompt = _pick(rng, ["Hello", "The cat", "ü∂ and more", "a b c d e f"])
    else:
        request.prompt_token_ids.extend(rng.integers(5, 2000, int(rng.integers(1, 40))).tolist())
    request.sampling.max_tokens = int(rng.integers(1, 12))
    request.sampling.ignore_eos = bool(rng.random() < 0.5)
    return request


def _mutate_generate(rng: np.random.Generator, request: pb.GenerateRequest) -> None:
    """Spoil (or stretch) one thing: model, version, prompt, a sampling field, stops."""
    what = int(rng.integers(8))
    if what == 0:
        request.model = _pick(rng, ["mlp", "nope", "", "ü∂"])
    elif what == 1:
        request.version = int(_pick(rng, [1, 3, -2]))
    elif what == 2:
        request.prompt = _pick(rng, ["", " ", "\x00", "a" * 3000])
    elif what == 3:
        ids = rng.integers(-5, 3000, int(_pick(rng, [0, 1, 5, 2100]))).tolist()
        request.prompt_token_ids[:] = ids
    elif what == 4:
        request.ClearField("prompt")
        request.ClearField("prompt_token_ids")
    elif what == 5:
        request.sampling.stop.extend(_pick(rng, [[""], ["a"], ["x" * 5000], ["\x00", "ü"]]))
    elif what == 6:
        request.sampling.stop_token_ids.extend(_pick(rng, [[-1], [0], [2**31 - 1], [5, 6]]))
    else:
        field = _pick(rng, list(SAMPLING_VALUES))
        setattr(request.sampling, field, _pick(rng, SAMPLING_VALUES[field]))


def _random_generate(rng: np.random.Generator) -> pb.GenerateRequest:
    request = _valid_generate(rng)
    for _ in range(int(_pick(rng, [0, 0, 1, 1, 1, 2]))):
        _mutate_generate(rng, request)
    return request


def _stream(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> tuple[Code, str]:
    """Read at most 4 chunks, then cancel: long streams end early and free their blocks."""
    call = stub.Generate(request, timeout=20)
    try:
        for i, _ in enumerate(call):
            if i == 3:
                call.cancel()
                return Code.OK, "cancelled after 4 chunks"
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return Code.OK, ""


def test_random_generate_requests_get_table_statuses_and_free_every_block(
    gen_server: ServerThread,
) -> None:
    rng = np.random.default_rng(112026)
    requests = [_random_generate(rng) for _ in range(160)]
    with grpc.insecure_channel(gen_server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda r: _stream(stub, r), requests))
        seen = _tally(answers, GENERATE_CODES, requests)
        assert seen.get(Code.OK, 0) >= 10 and seen.get(Code.INVALID_ARGUMENT, 0) >= 30, seen
        with Client(gen_server.target, retries=0) as client:
            status = wait_generator_idle(client, "tinylm", timeout=10)
        # Aborted streams leave the engine within a step: nothing runs, waits or holds a block.
        assert (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0), status
        good = pb.GenerateRequest(
            model="tinylm",
            prompt="Hello",
            sampling=pb.SamplingParams(max_tokens=3, ignore_eos=True),
        )
        tokens = [t for chunk in stub.Generate(good, timeout=30) for t in chunk.token_ids]
        assert len(tokens) == 3
