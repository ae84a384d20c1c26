"""KV slots on the CUDA provider: the fp16 builder folder GPU users download, served by
tensord's own loader with its KV cache in device memory.

The folder is build/gpu-models/llama-fp16-cuda (`make gpu-models` here, carried to the GPU
host: tests/gpu/builder_fp16.py); without it these tests fail, saying so, rather than pass.

  * the loader puts the folder on the CUDA provider, on the "slots" KV path, its slots in
    device memory (float16, sized from the device's free memory);
  * streams started one after another (a prompt joining while others decode, a short one
    leaving a hole that the top slot moves into, device to device) each give the greedy
    tokens of their prompt run alone, and those agree with transformers' float32
    reference up to the first float16 near tie;
  * the staggered streams repeat the prompts run alone: their stored prefixes are copied
    from the page-locked host prefix store into device slots, with the same tokens;
  * a decode pass binds the slots in place (present values come back at the slot
    addresses, on the device) and moves only token ids, the mask and logits: measured at
    contexts 32 and 1000, batches 1 and 8, with a profiled session of the same model
    (tests/gpu/slot_traffic.py says where bytes can cross and how each is counted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.generate_reference import ReferenceRun
from tests.gpu import builder_fp16
from tests.gpu.slot_traffic import (
    check_bound_in_place,
    check_traffic,
    measure_decode,
    open_profiled,
    open_runner,
)

pytestmark = [pytest.mark.gpu, pytest.mark.ort_gpu, pytest.mark.timeout(240)]

CUDA = "CUDAExecutionProvider"
STREAM_TIE = 0.05
"""A near tie between a stream and its prompt alone: both run in float16 on the same
device, but a pass of several rows may take other GEMM kernels than a pass of one (other
summation orders), so where the alone run's top two logits are this close, either token
may come first (that step and every later one are not compared)."""
MAX_TOKENS = (12, 32, 32, 32)
"""Per prompt of builder_fp16.PROMPTS: the first stream leaves early, so the top slot's
sequence moves into its slot while the others decode."""


@pytest.fixture(scope="module")
def folder() -> Path:
    path = builder_fp16.FOLDER
    if not (path / "genai_config.json").is_file() or not builder_fp16.REFERENCE.is_file():
        pytest.fail(
            f"{path} is not here: run `make gpu-models` and carry build/gpu-models "
            "(docs/development.md, The GPU plan)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[tuple[Any, Any]]:
    from tensord.backends.base import DeviceOptions
    from tensord.backends.ort_session import prepare_cuda_libraries
    from tensord.generate.engine.loader import load_engine
    from tensord.modelconfig.model import ModelConfig

    print(prepare_cuda_libraries())
    config = ModelConfig(kind="generator", preferred_provider="cuda")
    engine, placement, _, _ = load_engine(
        "llama-fp16-cuda", folder / "model.onnx", config, DeviceOptions()
    )
    yield engine, placement
    engine.close()


def test_builder_folder_serves_on_device_slots(engine: tuple[Any, Any]) -> None:
    import numpy as np

    from tensord.generate.worker.kv_slots import SlotStorage

    served, placement = engine
    assert placement.provider == CUDA, placement.provider_reason
    kv = served.kv
    assert kv.name == "slots", kv.reason
    assert isinstance(kv.storage, SlotStorage)
    assert kv.storage.device == "cuda"
    assert kv.storage.layout.dtype == np.dtype(np.float16)
    assert kv.storage.num_slots == served.limits.max_num_seqs == 64  # the default
    assert served.limits.max_model_len == 2048  # the folder's context
    assert kv.nbytes == kv.storage.nbytes == 64 * kv.storage.layout.slot_bytes


async def _generate(
    served: Any, prompt: Sequence[int], max_tokens: int, first: asyncio.Event | None = None
) -> tuple[list[int], list[float]]:
    """A greedy stream's tokens and each step's top-2 logprob (= logit) gap."""
    from tensord.generate.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    tokens: list[int] = []
    gaps: list[float] = []
    async for chunk in served.generate(list(prompt), params):
        tokens.extend(chunk.token_ids)
        gaps.extend(lp.top[0][1] - lp.top[1][1] for lp in chunk.logprobs or [])
        if first is not None:
            first.set()
    return tokens, gaps


async def _staggered(served: Any, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Each prompt as a stream, the next one started once the one before has a token."""
    tasks = []
    previous: asyncio.Event | None = None
    for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
        if previous is not None:
            await previous.wait()
        previous = asyncio.Event()
        tasks.append(asyncio.create_task(_generate(served, prompt, max_tokens, previous)))
    return [tokens for tokens, _ in await asyncio.gather(*tasks)]


def test_staggered_streams_equal_each_alone_and_transformers(
    engine: tuple[Any, Any],
) -> None:
    served, _ = engine
    prompts = builder_fp16.PROMPTS

    async def alone_then_staggered() -> tuple[list[Any], list[list[int]], int]:
        """Each prompt alone, then all as staggered streams (one event loop)."""
        pairs = zip(prompts, MAX_TOKENS, strict=True)
        alone = [await _generate(served, p, n) for p, n in pairs]
        stats = served.stats()
        return alone, await _staggered(served, prompts), stats

    alone, streams, before = asyncio.run(alone_then_staggered())
    moves = before.slot_moves
    reference = json.loads(builder_fp16.REFERENCE.read_text())["runs"]
    against_reference = []
    for (tokens, _), run in zip(alone, reference, strict=True):
        expected = ReferenceRun(
            tuple(run["prompt"]),
            tuple(run["tokens"]),
            tuple(run["top2_gaps"]),
            tuple(run["max_logits"]),
            tie_gap=builder_fp16.FP16_TIE,
        )
        against_reference.append(expected.check(tokens))
    against_alone = []
    for prompt, (tokens, gaps), got in zip(prompts, alone, streams, strict=True):
        assert len(got) == len(tokens)
        run = ReferenceRun(
            tuple(prompt), tuple(tokens), tuple(gaps), (0.0,) * len(gaps), tie_gap=STREAM_TIE
        )
        against_alone.append(run.check(got))
    print(
        f"tokens compared: with transformers {against_reference} of {MAX_TOKENS}; "
        f"streams with their prompt alone {against_alone}"
    )
    after = served.stats()
    assert after.slot_moves > moves, "no sequence moved slots: the compaction is untested"
    # The staggered prompts repeat the ones run alone: their stored blocks were copied from
    # page-locked host memory into device slots (16 + 64 + 288 tokens), and still gave the
    # tokens of their prompts alone.
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == 16 + 64 + 288
    assert after.prefix_bytes_loaded > before.prefix_bytes_loaded
    assert after.prefix_bytes_saved > 0
    assert sum(against_reference) >= 8 and sum(against_alone) >= 8, (
        "near ties from the first steps: too little was compared"
    )


def _load(path: Path) -> tuple[Any, Any]:
    from tensord.backends.base import DeviceOptions
    from tensord.backends.ort_session import prepare_cuda_libraries
    from tensord.generate.engine.loader import load_engine
    from tensord.modelconfig.model import ModelConfig

    if not (path / "model.onnx").is_file():
        pytest.fail(f"{path} is not here: run `make gpu-models`", pytrace=False)
    prepare_cuda_libraries()
    config = ModelConfig(kind="generator", preferred_provider="cuda")
    engine, placement, _, _ = load_engine(path.name, path / "model.onnx", config, DeviceOptions())
    return engine, placement


def test_a_float16_optimum_export_is_rewritten_onto_device_slots() -> None:
    """The Optimum export of the same weights, converted to float16: its attention
    rewritten onto GroupQueryAttention on the CUDA provider, checked against the export,
    its prefixes reused; alone, each prompt gives transformers' tokens up to the first
    float16 near tie, and a repeated prompt comes back over its stored prefix."""
    import numpy as np

    served, placement = _load(builder_fp16.OPTIMUM_FP16)
    try:
        assert placement.provider == CUDA, placement.provider_reason
        kv = served.kv
        assert kv.name == "slots", kv.reason
        assert "rewritten at load onto GroupQueryAttention" in kv.reason
        assert "prefixes not reused" not in kv.reason, kv.reason
        assert kv.storage.device == "cuda" and kv.storage.layout.dtype == np.dtype(np.float16)
        pairs = list(zip(builder_fp16.PROMPTS, MAX_TOKENS, strict=True))

        async def runs() -> list[tuple[list[int], list[float]]]:
            return [await _generate(served, p, n) for p, n in pairs + pairs[-1:]]

        *alone, again = asyncio.run(runs())
        reference = json.loads(builder_fp16.REFERENCE.read_text())["runs"]
        compared = [
            ReferenceRun(
                tuple(run["prompt"]),
                tuple(run["tokens"]),
                tuple(run["top2_gaps"]),
                tuple(run["max_logits"]),
                tie_gap=builder_fp16.FP16_TIE,
            ).check(tokens)
            for (tokens, _), run in zip(alone, reference, strict=True)
        ]
        print(f"float16 Optimum export on device slots: tokens compared {compared}")
        assert sum(compared) >= 8, "near ties from the first steps: too little was compared"
        tokens, gaps = alone[-1]
        ReferenceRun(
            tuple(pairs[-1][0]),
            tuple(tokens),
            tuple(gaps),
            (0.0,) * len(gaps),
            tie_gap=STREAM_TIE,
        ).check(again[0])
        stats = served.stats()
        assert stats.prefix_hit_tokens >= 288 and stats.prefix_bytes_loaded > 0
    finally:
        served.close()


def test_a_float32_optimum_export_keeps_the_paged_path_on_cuda() -> None:
    """GroupQueryAttention on CUDA takes float16 or bfloat16: a float32 export is served
    as exported, with that reason."""
    served, placement = _load(builder_fp16.OPTIMUM_FP32)
    try:
        assert placement.provider == CUDA, placement.provider_reason
        assert served.kv.name == "paged"
        assert "takes float16 or bfloat16, and this export is float32" in served.kv.reason
    finally:
        served.close()


def test_decode_binds_slots_in_place_and_moves_no_kv(folder: Path, tmp_path: Path) -> None:
    from tensord.backends.ort_session import prepare_cuda_libraries

    prepare_cuda_libraries()
    session = open_profiled(
        folder / "model.onnx", tmp_path / "slots", [CUDA, "CPUExecutionProvider"]
    )
    assert session.session.get_providers()[0] == CUDA
    runner, storage = open_runner(session, folder, slots=8, length=2048, device="cuda")
    steps = measure_decode(session, runner, 2048, contexts=(32, 1000), batches=(1, 8))
    print("\n".join(step.describe() for step in steps))
    for step in steps:
        assert step.binding is not None
        check_bound_in_place(step.binding, storage, 0, step.batch)
    base, slab0 = storage.address(0, 0, 0), storage.layout.layer_slab_bytes(0)
    for record in session.runs:
        if record.label == "prefill":  # a prompt in its own slot, at batch 1
            bound = record.binding.inputs["past_key_values.0.key"]
            assert bound.ptr is not None
            check_bound_in_place(record.binding, storage, (bound.ptr - base) // slab0, 1)
    slab = min(storage.layout.layer_slab_bytes(i) for i in range(storage.layout.num_layers))
    check_traffic(steps, slab, CUDA)
