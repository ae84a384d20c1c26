"""The soak run's load: mixed Predict (and Generate where a generator model is served) with
random cancellations, short deadlines and bad inputs, every outcome counted by kind and
status. Each kind has the statuses it may end with; anything else is an unexpected error.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from tensord.dtypes import DType
from tensord.server.tensord_v1.codec import encode_tensor
from tensord.v1 import inference_pb2 as pb
from tensord.v1 import inference_pb2_grpc as pb_grpc

OK = "OK"
# What each kind of call may end with; anything else counts as unexpected.
EXPECTED: dict[str, frozenset[str]] = {
    "predict": frozenset({OK}),
    "predict_cancelled": frozenset({OK, "CANCELLED"}),
    "predict_deadline": frozenset({OK, "DEADLINE_EXCEEDED"}),
    "bad_shape": frozenset({"INVALID_ARGUMENT"}),
    "bad_dtype": frozenset({"INVALID_ARGUMENT"}),
    "unknown_model": frozenset({"NOT_FOUND"}),
    "unknown_output": frozenset({"INVALID_ARGUMENT"}),
    "generate": frozenset({OK}),
    "generate_cancelled": frozenset({OK, "CANCELLED"}),
}
GENERATOR_KINDS = frozenset({"generate", "generator"})


@dataclass(slots=True)
class ModelShape:
    """What a valid request to one model needs, read from Info."""

    name: str
    inputs: list[tuple[str, DType, tuple[int, ...]]]
    outputs: list[str]
    max_batch_size: int

    def request(self, rng: random.Random, rows: int | None = None) -> pb.PredictRequest:
        """A valid request with seeded random data and 1-4 rows where the model batches."""
        batch = rows or (rng.randint(1, min(4, self.max_batch_size)) if self.max_batch_size else 1)
        tensors = []
        for name, dtype, dims in self.inputs:
            shape = tuple(batch if i == 0 and d == -1 else (1 if d == -1 else d)
                          for i, d in enumerate(dims))  # fmt: skip
            data = np.random.default_rng(rng.randrange(1 << 30)).random(shape)
            tensors.append(encode_tensor(name, (data * 100).astype(dtype.numpy)))
        return pb.PredictRequest(model=self.name, inputs=tensors)


def shapes_from_info(info: pb.InfoResponse) -> tuple[list[ModelShape], list[str]]:
    """The READY predict models and the READY generator models."""
    predict, generators = [], []
    for m in info.models:
        if m.state != pb.MODEL_STATE_READY:
            continue
        if m.kind in GENERATOR_KINDS:
            generators.append(m.name)
            continue
        inputs = [(t.name, DType(t.dtype), tuple(t.shape)) for t in m.inputs]
        if any(dtype is DType.STRING for _, dtype, _ in inputs):
            continue
        predict.append(ModelShape(m.name, inputs, [t.name for t in m.outputs], m.max_batch_size))
    return predict, generators


@dataclass(slots=True)
class Tally:
    """Outcomes by kind and status."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    tokens: int = 0

    def add(self, kind: str, status: str, detail: str = "") -> None:
        self.counts[(kind, status)] += 1
        if status not in EXPECTED[kind] and len(self.unexpected) < 50:
            self.unexpected.append(f"{kind}: {status}: {detail}")

    def by_status(self) -> dict[str, int]:
        """Calls per final status over every kind."""
        out: Counter[str] = Counter()
        for (_, status), n in self.counts.items():
            out[status] += n
        return dict(out)

    def unexpected_count(self) -> int:
        return sum(n for (kind, status), n in self.counts.items() if status not in EXPECTED[kind])


@dataclass(slots=True)
class Mix:
    """Shares of each kind of call (the rest are plain valid Predicts)."""

    cancel: float = 0.05
    deadline: float = 0.03
    bad: float = 0.05
    generate: float = 0.2
    """Of all calls, when a generator is served; the other shares apply to the rest."""


class SoakLoad:
    """`workers` coroutines sending calls until `stop` is set."""

    def __init__(self, target: str, seed: int, mix: Mix) -> None:
        self.target = target
        self.mix = mix
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.models: list[ModelShape] = []
        self.generators: list[str] = []
        self._rng = random.Random(seed)

    async def refresh(self, stub: pb_grpc.InferenceServiceStub) -> None:
        """Read the served models from Info (again after a reload)."""
        self.models, self.generators = shapes_from_info(await stub.Info(pb.InfoRequest()))

    async def run(self, workers: int) -> None:
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            await self.refresh(stub)
            await asyncio.gather(*(self._worker(stub, i) for i in range(workers)))

    async def _worker(self, stub: pb_grpc.InferenceServiceStub, index: int) -> None:
        rng = random.Random(self._rng.randrange(1 << 30) + index)
        while not self.stop.is_set():
            m = self.mix
            roll = rng.random()
            if self.generators:
                if roll < m.generate:
                    await self._generate(stub, rng)
                    continue
                roll = (roll - m.generate) / (1 - m.generate)  # the rest split as without
            if roll < m.cancel:
                await self._predict(stub, rng, "predict_cancelled", cancel_after=rng.random() / 500)
            elif roll < m.cancel + m.deadline:
                await self._predict(stub, rng, "predict_deadline", deadline_s=rng.random() / 500)
            elif roll < m.cancel + m.deadline + m.bad:
                await self._bad(stub, rng)
            else:
                await self._predict(stub, rng, "predict")

    async def _predict(
        self,
        stub: pb_grpc.InferenceServiceStub,
        rng: random.Random,
        kind: str,
        *,
        cancel_after: float | None = None,
        deadline_s: float | None = 30.0,
        request: pb.PredictRequest | None = None,
    ) -> None:
        if request is None:
            request = rng.choice(self.models).request(rng)
        call = stub.Predict(request, timeout=deadline_s)
        if cancel_after is not None:
            asyncio.get_running_loop().call_later(cancel_after, call.cancel)
        try:
            await call
            self.tally.add(kind, OK)
        except asyncio.CancelledError:
            self.tally.add(kind, "CANCELLED")
        except grpc.aio.AioRpcError as exc:
            self.tally.add(kind, exc.code().name, exc.details() or "")

    async def _bad(self, stub: pb_grpc.InferenceServiceStub, rng: random.Random) -> None:
        model = rng.choice(self.models)
        request = model.request(rng)
        kind = rng.choice(["bad_shape", "bad_dtype", "unknown_model", "unknown_output"])
        tensor = request.inputs[0]
        if kind == "bad_shape":
            tensor.shape.append(2)  # one dimension too many for the bytes it carries
        elif kind == "bad_dtype":
            tensor.dtype = pb.DATA_TYPE_FLOAT64 if tensor.dtype != 10 else pb.DATA_TYPE_INT8
        elif kind == "unknown_model":
            request.model = f"no-such-model-{rng.randrange(1000)}"
        else:
            request.output_names.append("no_such_output")
        await self._predict(stub, rng, kind, request=request)

    async def _generate(self, stub: pb_grpc.InferenceServiceStub, rng: random.Random) -> None:
        cancel = rng.random() < 0.3
        kind = "generate_cancelled" if cancel else "generate"
        request = pb.GenerateRequest(
            model=rng.choice(self.generators),
            prompt=f"soak prompt {rng.randrange(10_000)}",
            sampling=pb.SamplingParams(max_tokens=rng.randint(1, 32), seed=rng.randrange(1000)),
        )
        call = stub.Generate(request, timeout=60)
        stop_after = rng.randint(1, 4) if cancel else None
        chunks = 0
        try:
            async for chunk in call:
                self.tally.tokens += len(chunk.token_ids)
                chunks += 1
                if stop_after is not None and chunks >= stop_after:
                    call.cancel()
                    break
            self.tally.add(kind, "CANCELLED" if call.cancelled() else OK)
        except asyncio.CancelledError:
            self.tally.add(kind, "CANCELLED")
        except grpc.aio.AioRpcError as exc:
            self.tally.add(kind, exc.code().name, exc.details() or "")


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def sample_rss(
    pid: int, every: float, into: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    """Append (monotonic time, RSS) every `every` seconds until `stop`."""
    while not stop.is_set():
        into.append((time.monotonic(), rss_bytes(pid)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
