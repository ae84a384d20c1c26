"""Generate over a real server: greedy equality under concurrency, seeds, stops, cancels."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tensord_client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    FinishReason,
    GenerateChunk,
    Unavailable,
)
from tests.conftest import ServerThread, serve, start_server, wait_generator_idle
from tests.generate_reference import ReferenceModel
from tests.models import SMALL_GENERATOR_TOML, small_generator

MODEL = "tinylm"


@pytest.fixture(scope="module")
def gen_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_generator(demo_repo, tmp_path_factory.mktemp("generator-repo"))


@pytest.fixture(scope="module")
def gen_server(gen_repo: Path) -> Iterator[ServerThread]:
    srv = start_server(gen_repo)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(gen_repo: Path) -> ReferenceModel:
    return ReferenceModel(gen_repo / MODEL)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 90, count)
    return [rng.integers(5, 2000, n).tolist() for n in lengths]


async def _collect(
    client: AsyncClient, prompt: list[int], delay: float, **sampling: object
) -> tuple[list[int], list[GenerateChunk]]:
    await asyncio.sleep(delay)
    chunks = [c async for c in client.generate(MODEL, token_ids=prompt, **sampling)]
    return [t for c in chunks for t in c.token_ids], chunks


def test_sixteen_streams_equal_the_no_cache_reference(
    gen_server: ServerThread, reference: ReferenceModel
) -> None:
    prompts = _prompts(16)
    new_tokens = 24

    async def run() -> list[tuple[list[int], list[GenerateChunk]]]:
        async with AsyncClient(gen_server.target, timeout=60) as client:
            return await asyncio.gather(
                *(
                    _collect(
                        client, p, 0.004 * i, max_tokens=new_tokens, temperature=0, ignore_eos=True
                    )
                    for i, p in enumerate(prompts)
                )
            )

    results = asyncio.run(run())
    compared = 0
    for prompt, (tokens, chunks) in zip(prompts, results, strict=True):
        assert len(tokens) == new_tokens
        last = chunks[-1]
        assert last.finish_reason is FinishReason.LENGTH
        assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
        assert last.usage is not None and last.usage.prompt_tokens == len(prompt)
        assert last.usage.completion_tokens == new_tokens
        assert last.usage.time_to_first_token_ms > 0
        assert [c.index for c in chunks] == [
            sum(len(c.token_ids) for c in chunks[:i]) for i in range(len(chunks))
        ]
        compared += reference.greedy(prompt, new_tokens).check(tokens)
    assert compared >= 16 * new_tokens * 0.9  # near ties are rare on this model
    assert len({tuple(t) for t, _ in results}) == 16  # different prompts, different outputs
    with Client(gen_server.target) as client:
        kv = wait_generator_idle(client, MODEL).kv_cache
        assert kv.used_blocks == 0 and kv.free_blocks == kv.total_blocks == 160
        assert kv.cached_blocks > 0  # full prompt blocks stay cached for reuse


def test_prefix_hits_give_the_same_tokens(gen_server: ServerThread) -> None:
    prompt = list(range(100, 150))  # 50 tokens: 3 full blocks of 16
    with Client(gen_server.target) as client:
        first = [
            t
            for c in client.generate(
                MODEL, token_ids=prompt, max_tokens=8, temperature=0, ignore_eos=True
            )
            for t in c.token_ids
        ]
        (model,) = [m for m in client.info().models if m.name == MODEL]
        hits_before = model.generator.prefix_hit_tokens
        again = [
            t
            for c in client.generate(
                MODEL, token_ids=prompt, max_tokens=8, temperature=0, ignore_eos=True
            )
            for t in c.token_ids
        ]
        (model,) = [m for m in client.info().models if m.name == MODEL]
        assert model.generator.prefix_hit_tokens - hits_before == 48
    assert again == first


def test_seed_gives_the_same_tokens_alone_and_in_a_batch(gen_server: ServerThread) -> None:
    prompt = list(range(7, 27))
    sampling = {"max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": 1234}

    async def run() -> tuple[list[int], list[list[int]]]:
        async with AsyncClient(gen_server.target, timeout=60) as client:
            alone, _ = await _collect(client, prompt, 0, ignore_eos=True, **sampling)
            crowd = await asyncio.gather(
                *(
                    _collect(client, p, 0.002 * i, ignore_eos=True, **sampling)
                    for i, p in enumerate([prompt, *_prompts(7, seed=5)])
                )
            )
            return alone, [tokens for tokens, _ in crowd]

    alone, crowd = asyncio.run(run())
    assert crowd[0] == alone
    assert len(alone) == 16
    with Client(gen_server.target) as client:
        other_seed = [
            t
            for c in client.generate(
                MODEL, token_ids=prompt, ignore_eos=True, **{**sampling, "seed": 99}
            )
            for t in c.token_ids
        ]
    assert other_seed != alone


def test_text_stop_sequence_is_not_emitted(gen_server: ServerThread) -> None:
    with Client(gen_server.target) as client:
        full = list(
            client.generate(MODEL, "the river", max_tokens=30, temperature=0, ignore_eos=True)
        )
        text = "".join(c.text for c in full)
        assert len(text) > 12
        stop = text[8:11]  # a stop string inside the output, likely across tokens
        cut = list(
            client.generate(
                MODEL, "the river", max_tokens=30, temperature=0, ignore_eos=True, stop=[stop]
            )
        )
    got = "".join(c.text for c in cut)
    assert got == text[: text.index(stop)]
    assert cut[-1].finish_reason == "STOP"


def test_logprobs_and_text_deltas(gen_server: ServerThread) -> None:
    with Client(gen_server.target) as client:
        chunks = list(
            client.generate(
                MODEL, "hello", max_tokens=6, temperature=0, logprobs=3, ignore_eos=True
            )
        )
    entries = [lp for c in chunks for lp in c.logprobs]
    assert len(entries) == 6
    for lp in entries:
        assert len(lp.top) == 3 and lp.logprob <= 0
        assert lp.top[0].token_id == lp.token_id  # greedy picks the most likely
        assert lp.top[0].logprob >= lp.top[1].logprob >= lp.top[2].logprob


def test_cancelled_streams_free_their_blocks(gen_server: ServerThread) -> None:
    async def cancel_one(client: AsyncClient, i: int) -> int:
        seen = 0
        async for chunk in client.generate(
            MODEL, token_ids=list(range(10, 40 + i % 30)), max_tokens=200, ignore_eos=True
        ):
            seen += len(chunk.token_ids)
            if seen >= 3:
                break  # the client's generator cancels the call
        return seen

    async def run() -> list[int]:
        async with AsyncClient(gen_server.target, timeout=60) as client:
            results = []
            for start in range(0, 100, 20):
                results += await asyncio.gather(
                    *(cancel_one(client, i) for i in range(start, start + 20))
                )
            return results

    seen = asyncio.run(run())
    assert len(seen) == 100 and min(seen) >= 3
    with Client(gen_server.target) as client:
        status = wait_generator_idle(client, MODEL)
        kv = status.kv_cache
        assert kv.used_blocks == 0 and kv.free_blocks == kv.total_blocks
        assert status.running == 0 and status.waiting == 0


def test_deadlines_end_streams_and_free_blocks(gen_server: ServerThread) -> None:
    with Client(gen_server.target) as client:
        for _ in range(5):
            got: list[GenerateChunk] = []
            with pytest.raises(DeadlineExceeded) as info:
                for chunk in client.generate(
                    MODEL,
                    token_ids=list(range(50, 90)),
                    max_tokens=1500,
                    ignore_eos=True,
                    timeout=0.3,
                ):
                    got.append(chunk)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert got  # tokens streamed before the deadline stay valid
        kv = wait_generator_idle(client, MODEL).kv_cache
        assert kv.used_blocks == 0 and kv.free_blocks == kv.total_blocks


@pytest.mark.parametrize(
    ("kwargs", "code", "words"),
    [
        ({"max_tokens": 0}, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        ({"max_tokens": 5000}, grpc.StatusCode.INVALID_ARGUMENT, "context"),
        ({"temperature": -1.0}, grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        ({"top_p": 1.5}, grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        ({"top_k": -2}, grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
        ({"repetition_penalty": 0.0}, grpc.StatusCode.INVALID_ARGUMENT, "repetition_penalty"),
        ({"logprobs": 10_000}, grpc.StatusCode.INVALID_ARGUMENT, "logprobs"),
        ({"stop": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "stop"),
    ],
)
def test_bad_sampling_is_refused(
    gen_server: ServerThread, kwargs: dict[str, object], code: grpc.StatusCode, words: str
) -> None:
    with Client(gen_server.target, retries=0) as client:
        with pytest.raises(grpc.RpcError) as info:
            list(client.generate(MODEL, "hi", **kwargs))
        assert info.value.code() == code, info.value.details()
        assert words in info.value.details()
        ok = list(client.generate(MODEL, "hi", max_tokens=2, ignore_eos=True))
        assert sum(len(c.token_ids) for c in ok) == 2


def test_bad_prompts_and_models_are_refused(gen_server: ServerThread, server: ServerThread) -> None:
    with Client(gen_server.target, retries=0) as client:
        cases = [
            ({"prompt": "x" * 20, "token_ids": [1, 2]}, grpc.StatusCode.INVALID_ARGUMENT, "one of"),
            ({"token_ids": [5] * 3000}, grpc.StatusCode.INVALID_ARGUMENT, "context"),
            ({"token_ids": [5, 999_999]}, grpc.StatusCode.INVALID_ARGUMENT, "vocabulary"),
            ({"prompt": ""}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        ]
        for kwargs, code, words in cases:
            prompt = kwargs.pop("prompt", None)
            with pytest.raises(grpc.RpcError) as info:
                list(client.generate(MODEL, prompt, **kwargs))  # type: ignore[arg-type]
            assert info.value.code() == code, (kwargs, info.value.details())
            assert words in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            list(client.generate("nope", "hi"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with Client(server.target, retries=0) as client:
        with pytest.raises(grpc.RpcError) as info:
            list(client.generate("mlp", "hi"))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not a generator" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            client.predict(MODEL, {"input_ids": np.zeros((1, 2), np.int64)})
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "Generate" in info.value.details()


def test_prompt_token_limit(gen_repo: Path) -> None:
    srv = serve(gen_repo, limits__max_prompt_tokens=8)
    try:
        with Client(srv.target, retries=0) as client:
            with pytest.raises(grpc.RpcError) as info:
                list(client.generate(MODEL, token_ids=list(range(10, 19)), max_tokens=2))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "9 tokens, more than the 8" in info.value.details()
            ok = list(client.generate(MODEL, token_ids=list(range(10, 18)), max_tokens=2))
            assert sum(len(c.token_ids) for c in ok) >= 1
    finally:
        srv.stop()


@pytest.mark.in_process  # stop(grace=1.0); with frontends: tests/e2e/test_frontends.py
def test_drain_ends_long_streams_with_unavailable(gen_repo: Path) -> None:
    srv = serve(gen_repo)
    got: list[GenerateChunk] = []
    stopper = threading.Thread(target=srv.stop, kwargs={"grace": 1.0})
    with Client(srv.target, retries=0) as client:
        stream = client.generate(MODEL, token_ids=[3, 4, 5], max_tokens=2000, ignore_eos=True)
        got.append(next(stream))
        stopper.start()
        with pytest.raises(Unavailable) as info:
            for chunk in stream:
                got.append(chunk)
    stopper.join(15)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "shutting down" in info.value.details()
    assert sum(len(c.token_ids) for c in got) < 2000


def test_stream_interval_merges_tokens_but_not_the_first(
    gen_repo: Path, gen_server: ServerThread, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(gen_repo, root)
    (root / MODEL / "model.toml").write_text(SMALL_GENERATOR_TOML + "stream_interval = 3\n")
    prompt, new_tokens = list(range(40, 60)), 13
    with Client(gen_server.target) as client:
        expected = [
            t
            for c in client.generate(MODEL, token_ids=prompt, max_tokens=new_tokens, temperature=0)
            for t in c.token_ids
        ]
        (auto,) = [m for m in client.info().models if m.name == MODEL]
        assert auto.generator.stream_interval == 0  # "auto", the default
    srv = serve(root)
    try:
        with Client(srv.target) as client:
            chunks = list(
                client.generate(MODEL, token_ids=prompt, max_tokens=new_tokens, temperature=0)
            )
            (model,) = [m for m in client.info().models if m.name == MODEL]
    finally:
        srv.stop()
    assert model.generator.stream_interval == 3
    assert [t for c in chunks for t in c.token_ids] == expected
    # The first token goes alone and at once, then a chunk every 3 model passes at most,
    # and the last chunk carries the finish reason.
    assert len(chunks[0].token_ids) == 1
    assert len(chunks) <= 1 + -(-(new_tokens - 1) // 3) + 1
    assert chunks[-1].finish_reason == "LENGTH"
    assert [c.index for c in chunks] == [
        sum(len(c.token_ids) for c in chunks[:i]) for i in range(len(chunks))
    ]


def test_a_tight_token_budget_prefills_one_token_a_step(
    gen_repo: Path, reference: ReferenceModel, tmp_path: Path
) -> None:
    # 7 streams decoding take 7 of the 8 tokens a step: a new prompt is prefilled one
    # token a step beside them, and every stream still equals the no-cache reference.
    root = tmp_path / "repo"
    shutil.copytree(gen_repo, root)
    (root / MODEL / "model.toml").write_text(
        "[generator]\nblock_size = 16\nnum_blocks = 160\nmax_num_seqs = 8\n"
        "max_num_batched_tokens = 8\n"
    )
    prompts = [list(range(10 + i, 13 + i)) for i in range(7)] + [list(range(500, 510))]
    lengths = [120] * 7 + [20]  # the seven still decode while the eighth is prefilled

    async def run() -> list[tuple[list[int], list[GenerateChunk]]]:
        async with AsyncClient(srv.target, timeout=60) as client:
            return await asyncio.gather(
                *(
                    _collect(
                        client,
                        p,
                        0.0 if i < 7 else 0.05,
                        max_tokens=n,
                        temperature=0,
                        ignore_eos=True,
                    )
                    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
                )
            )

    srv = serve(root)
    try:
        results = asyncio.run(run())
        with Client(srv.target) as client:
            assert wait_generator_idle(client, MODEL).kv_cache.used_blocks == 0
    finally:
        srv.stop()
    for prompt, n, (tokens, chunks) in zip(prompts, lengths, results, strict=True):
        assert len(tokens) == n
        assert chunks[-1].finish_reason is FinishReason.LENGTH
        assert reference.greedy(prompt, n).check(tokens) >= n // 2  # near ties are rare


def test_one_token_blocks_load_and_generate(
    gen_repo: Path, reference: ReferenceModel, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(gen_repo, root)
    (root / MODEL / "model.toml").write_text("[generator]\nblock_size = 1\nnum_blocks = 2100\n")
    srv = serve(root)
    try:
        with Client(srv.target) as client:
            prompt = list(range(70, 79))
            tokens = [
                t
                for c in client.generate(MODEL, token_ids=prompt, max_tokens=12, temperature=0)
                for t in c.token_ids
            ]
            assert wait_generator_idle(client, MODEL).kv_cache.used_blocks == 0
    finally:
        srv.stop()
    assert len(tokens) == 12
    assert reference.greedy(prompt, 12).check(tokens) >= 6


def test_drain_ends_requests_not_started_at_once(gen_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(gen_repo, root)
    (root / MODEL / "model.toml").write_text(
        "[generator]\nblock_size = 16\nnum_blocks = 160\nmax_num_seqs = 1\n"
        "max_num_batched_tokens = 64\n"
    )
    srv = serve(root)
    stopper = threading.Thread(target=srv.stop, kwargs={"grace": 4.0})
    with Client(srv.target, retries=0) as client:
        running = client.generate(MODEL, token_ids=[3, 4, 5], max_tokens=2000, ignore_eos=True)
        next(running)  # the one seat is taken
        waiting = client.generate(MODEL, token_ids=[6, 7, 8], max_tokens=5)
        result: list[grpc.RpcError] = []
        reader = threading.Thread(target=lambda: result.append(_error_of(waiting)))
        reader.start()
        deadline = time.monotonic() + 10
        while _waiting(client) == 0:  # until queued behind the running stream
            assert time.monotonic() < deadline, "the second stream never queued"
            time.sleep(0.01)
        start = time.monotonic()
        stopper.start()
        reader.join(10)
        took = time.monotonic() - start
        # The running stream finishes within the grace or is cut at its end, depending on
        # the host's speed (2,000 tokens take 3-5 s); test_drain_ends_long_streams_with_
        # unavailable covers the cut.
        with contextlib.suppress(grpc.RpcError):
            for _ in running:
                pass
    stopper.join(15)
    (error,) = result
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "had not started" in error.details()
    assert took < 2  # at the start of the drain, not at the end of its 4 s grace


def _waiting(client: Client) -> int:
    """Sequences waiting for a seat in the generator, as Info shows them."""
    (model,) = [m for m in client.info().models if m.name == MODEL]
    return int(model.generator.waiting)


def _error_of(stream: Iterator[GenerateChunk]) -> grpc.RpcError:
    try:
        for _ in stream:
            pass
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the stream ended without an error")


@pytest.mark.in_process  # reads the limiter's count
def test_max_generate_streams_holds_on_real_streams(gen_repo: Path) -> None:
    srv = serve(gen_repo, limits__max_generate_streams=1)
    try:
        assert srv.server is not None and srv.server.security.stream_limit is not None
        limiter = srv.server.security.stream_limit
        with Client(srv.target, retries=0) as client:
            first = client.generate(MODEL, token_ids=[3, 4, 5], max_tokens=2000, ignore_eos=True)
            next(first)  # the one slot is held
            with pytest.raises(grpc.RpcError) as info:
                list(client.generate(MODEL, token_ids=[6, 7], max_tokens=2))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_generate_streams = 1" in info.value.details()
            first.close()  # cancels the call: the slot comes back
            deadline = time.monotonic() + 10
            while limiter.active and time.monotonic() < deadline:
                time.sleep(0.02)
            assert limiter.active == 0
            tokens = [
                t
                for c in client.generate(MODEL, token_ids=[6, 7], max_tokens=2)
                for t in c.token_ids
            ]
            assert len(tokens) == 2
    finally:
        srv.stop()
