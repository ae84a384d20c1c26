"""The model runner against the no-cache reference: paged KV, ragged batches, decode view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.model.model_dir import read_generator_spec
from tensord.generate.worker.kv_storage import HostKVStorage, KVShape
from tensord.generate.worker.model_runner import ModelRunner
from tensord.modelconfig.model import ModelConfig
from tests.generate_reference import ReferenceModel

BLOCK = 4


@pytest.fixture(scope="module")
def tinylm(demo_repo: Path) -> Path:
    return demo_repo / "tinylm"


def _runner(directory: Path) -> tuple[ModelRunner, HostKVStorage]:
    spec = read_generator_spec(directory)
    backend = OnnxRuntimeBackend(spec.model_path, ModelConfig())
    shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
    storage = HostKVStorage(shape, num_blocks=64, block_size=BLOCK)
    return ModelRunner(backend.run, storage, spec.num_layers, spec.has_position_ids), storage


def test_ragged_batch_decodes_like_the_reference(tinylm: Path) -> None:
    runner, storage = _runner(tinylm)
    reference = ReferenceModel(tinylm)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 2000, n).tolist() for n in (5, 11, 2)]
    # Scattered, non-contiguous block tables (blocks 0.. are shuffled).
    order = rng.permutation(64).tolist()
    tables = [order[0:8], order[8:16], order[16:24]]
    new_tokens = 12
    outputs: list[list[int]] = [[] for _ in prompts]
    # Prefill all three at once (ragged), then decode them together.
    items = [ScheduledRequest(str(i), prompt, 0, tables[i]) for i, prompt in enumerate(prompts)]
    logits = runner.execute(items)
    for i in range(3):
        outputs[i].append(int(logits[str(i)].argmax()))
    for _ in range(new_tokens - 1):
        items = [
            ScheduledRequest(
                str(i), [outputs[i][-1]], len(prompts[i]) + len(outputs[i]) - 1, tables[i]
            )
            for i in range(3)
        ]
        logits = runner.execute(items)
        for i in range(3):
            outputs[i].append(int(logits[str(i)].argmax()))
    compared = 0
    for prompt, got in zip(prompts, outputs, strict=True):
        compared += reference.greedy(prompt, new_tokens).check(got)
    assert compared >= 30
    assert len({tuple(o) for o in outputs}) == 3  # different prompts, different outputs
    # The pool holds the keys of every computed position: gather one back and compare
    # with a fresh prefill's present (position 3 of prompt 1, layer 0).
    past = storage.reserve(1, len(prompts[1]))
    storage.gather([tables[1]], [len(prompts[1])], past)
    assert past[0].shape[2] == len(prompts[1]) and np.abs(past[0]).sum() > 0


def test_chunked_prefill_and_membership_changes(tinylm: Path) -> None:
    runner, _ = _runner(tinylm)
    reference = ReferenceModel(tinylm)
    a = list(range(40, 53))  # 13 tokens, prefilled in chunks of 5, 5, 3
    b = list(range(300, 306))
    ta, tb = list(range(0, 8)), list(range(8, 16))
    runner.execute([ScheduledRequest("a", a[:5], 0, ta, sample=False)])
    runner.execute([ScheduledRequest("a", a[5:10], 5, ta, sample=False)])
    out_a = [int(runner.execute([ScheduledRequest("a", a[10:], 10, ta)])["a"].argmax())]
    # a decodes alone, then b joins (prefill + decode in one step), then a leaves.
    out_a.append(int(runner.execute([ScheduledRequest("a", [out_a[-1]], 13, ta)])["a"].argmax()))
    step = runner.execute(
        [ScheduledRequest("a", [out_a[-1]], 14, ta), ScheduledRequest("b", b, 0, tb)]
    )
    out_a.append(int(step["a"].argmax()))
    out_b = [int(step["b"].argmax())]
    for n in range(3):
        step = runner.execute(
            [
                ScheduledRequest("a", [out_a[-1]], 15 + n, ta),
                ScheduledRequest("b", [out_b[-1]], 6 + n, tb),
            ]
        )
        out_a.append(int(step["a"].argmax()))
        out_b.append(int(step["b"].argmax()))
    for n in range(2):
        out_b.append(
            int(runner.execute([ScheduledRequest("b", [out_b[-1]], 9 + n, tb)])["b"].argmax())
        )
    reference.greedy(a, len(out_a)).check(out_a)
    reference.greedy(b, len(out_b)).check(out_b)
    assert len(out_a) == 6 and len(out_b) == 6


def test_one_token_chunks_beside_decodes(tinylm: Path) -> None:
    """A budget of a token or two a step cuts a prompt into one-token chunks at non-zero
    positions; they are prefills (no logits until the last), not decodes."""
    runner, _ = _runner(tinylm)
    reference = ReferenceModel(tinylm)
    a = list(range(60, 66))
    b = list(range(400, 404))
    ta, tb = list(range(0, 8)), list(range(8, 16))
    out_b = [int(runner.execute([ScheduledRequest("b", b, 0, tb)])["b"].argmax())]
    out_a: list[int] = []
    for pos in range(len(a)):
        last = pos == len(a) - 1
        step = runner.execute(
            [
                ScheduledRequest("b", [out_b[-1]], len(b) + len(out_b) - 1, tb),
                ScheduledRequest("a", [a[pos]], pos, ta, sample=last),
            ]
        )
        assert sorted(step.request_ids) == (["a", "b"] if last else ["b"])
        out_b.append(int(step["b"].argmax()))
        if last:
            out_a.append(int(step["a"].argmax()))
    for _ in range(3):
        step = runner.execute(
            [
                ScheduledRequest("a", [out_a[-1]], len(a) + len(out_a) - 1, ta),
                ScheduledRequest("b", [out_b[-1]], len(b) + len(out_b) - 1, tb),
            ]
        )
        out_a.append(int(step["a"].argmax()))
        out_b.append(int(step["b"].argmax()))
    reference.greedy(a, len(out_a)).check(out_a)
    reference.greedy(b, len(out_b)).check(out_b)
