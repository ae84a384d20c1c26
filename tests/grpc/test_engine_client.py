"""The data plane over the engine process's client, over real rings in one process: the
engine sends token ids only, and the frontend's data plane makes the same text, stops and
chunks the one-process data plane makes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from tensord.config import TensordConfig, load_config
from tensord.dataplane import DataPlane, GenerateCall, LocalEngine, SamplingParams
from tensord.procs import messages
from tensord.procs.engine import EngineHost
from tensord.procs.remote import RemoteEngine
from tensord.procs.ring import Ring
from tests.models import small_generator

MODEL = "tinylm"
PROMPT = "The quick brown fox jumps over the lazy dog, and then"


@pytest.fixture(scope="module")
def config(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> TensordConfig:
    root = small_generator(demo_repo, tmp_path_factory.mktemp("engine-client"))
    return load_config(None, env={}, overrides={"model_repository": str(root)})


async def _text(plane: DataPlane, **sampling: Any) -> tuple[list[int], str, str | None]:
    params = SamplingParams(temperature=0.0, **sampling)
    call = GenerateCall(MODEL, 0, PROMPT, [], params, None)
    tokens: list[int] = []
    text, finish = "", None
    async for chunk in plane.generate(call):
        tokens += chunk.token_ids
        text += chunk.text
        finish = chunk.finish_reason
    return tokens, text, finish


def _other_end(ring: Ring) -> Ring:
    """The same ring attached again, as the other process attaches it (its own fds)."""
    return Ring.attach(*(os.dup(fd) for fd in ring.fds()))


async def _linked(engine: LocalEngine, config: TensordConfig) -> AsyncGenerator[Any, None]:
    """A frontend's data plane over rings to an EngineHost serving `engine`; yields it
    and the list of every message the engine sent."""
    requests, replies = Ring.create(1 << 20), Ring.create(1 << 20)
    host = EngineHost(engine)
    host.add_frontend(0, replies, requests)
    remote = RemoteEngine(config)
    heard: list[Any] = []
    received = remote._received

    def recording(message: Any) -> None:
        heard.extend(message.messages if isinstance(message, messages.Batch) else [message])
        received(message)

    remote._received = recording  # type: ignore[method-assign]
    remote.attach(_other_end(requests), _other_end(replies))
    plane = DataPlane(remote, config)
    await plane.load_models()
    plane.serving = True
    try:
        yield plane, heard
    finally:
        await plane.close()
        host.close()


def test_the_engine_sends_token_ids_and_the_frontend_makes_the_text(
    config: TensordConfig,
) -> None:
    async def run() -> None:
        engine = LocalEngine.for_config(config)
        await engine.load_models()
        try:
            alone = DataPlane(engine, config)
            alone.serving = True
            tokens, text, finish = await _text(alone, max_tokens=24, ignore_eos=True)
            assert finish == "length" and len(tokens) == 24 and text
            # A stop string from the middle of the text: the stream ends before it.
            stop = text[len(text) // 2 :][:3]
            assert stop.strip(), text
            _, stopped, reason = await _text(alone, max_tokens=24, ignore_eos=True, stop=[stop])
            assert reason == "stop" and stopped == text[: text.index(stop)]

            linked = _linked(engine, config)
            plane, heard = await anext(linked)
            remote = plane.engine
            assert isinstance(remote, RemoteEngine)
            for _ in range(300):  # read on a worker thread once the table names the model
                if remote._tokenizers:
                    break
                await asyncio.sleep(0.01)
            assert remote._tokenizers, "the tokenizer was not read ahead of the first request"
            assert await _text(plane, max_tokens=24, ignore_eos=True) == (tokens, text, finish)
            again = await _text(plane, max_tokens=24, ignore_eos=True, stop=[stop])
            assert again[1:] == (stopped, "stop")
            kinds = {type(message) for message in heard}
            assert kinds <= {messages.Table, messages.Tokens, messages.Ended}, kinds
            outputs = [
                o
                for message in heard
                if isinstance(message, messages.Tokens)
                for o in message.outputs
            ]
            # Token ids only (an Output has no field for text).
            assert outputs and all(isinstance(t, int) for o in outputs for t in o.token_ids)
            # The stop string's request was stopped in the engine: nothing left running.
            for _ in range(100):
                if not engine._generations:
                    break
                await asyncio.sleep(0.01)
            assert engine._generations == {}
            await linked.aclose()
        finally:
            await engine.close()

    asyncio.run(run())


class _Sink:
    """An OutputSink that keeps what it hears, or raises on outputs."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.tokens: list[int] = []
        self.finished = False
        self.errors: list[BaseException] = []

    def outputs(self, outputs: list[Any]) -> None:
        if self.raises:
            raise RuntimeError("a broken sink")
        for out in outputs:
            self.tokens += out.new_token_ids
            self.finished = self.finished or out.finished

    def failed(self, request_ids: Any, error: BaseException) -> None:
        self.errors.append(error)

    def expired(self, request_ids: Any) -> None:
        self.errors.append(TimeoutError())


def test_a_sink_that_raises_ends_its_requests_and_no_others(config: TensordConfig) -> None:
    """One sink failing on its outputs (one frontend's link, say) fails its own request
    with INTERNAL; the other sink's request still gets every token, and both leave the
    engine (its in-flight count and request table empty)."""
    from tensord.dataplane import EngineCoreRequest
    from tensord.errors import InternalError
    from tensord.generate.core.sampling_params import GenerationDefaults
    from tensord.registry.version import GeneratorVersion

    async def run() -> None:
        engine = LocalEngine.for_config(config)
        assert not engine.table.readiness.ready  # nothing is SERVING before the load
        await engine.load_models()
        assert engine.table.readiness.ready
        try:
            (entry,) = engine.table.versions
            params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True).resolve(
                GenerationDefaults(), prompt_len=4, max_model_len=512, vocab_size=32000
            )
            good, bad = _Sink(), _Sink(raises=True)
            ended: list[str] = []
            for sink in (good, bad):
                request = EngineCoreRequest(MODEL, entry.version, [5, 6, 7, 8], params, None, 0.0)
                engine.add_generation(request, sink, lambda: ended.append("x"))
            for _ in range(500):
                if len(ended) == 2:
                    break
                await asyncio.sleep(0.01)
            assert good.finished and len(good.tokens) == 12 and not good.errors
            assert not bad.tokens and len(bad.errors) == 1
            assert isinstance(bad.errors[0], InternalError)
            assert len(ended) == 2 and engine._generations == {}
            mv = engine.registry.version(MODEL, entry.version)
            assert isinstance(mv, GeneratorVersion) and mv.inflight.count == 0
        finally:
            await engine.close()

    asyncio.run(run())
