"""tests/gpu/slot_traffic.py on the CPU, so that the GPU run cannot fail on its own tools:
ONNX Runtime's profile read as this onnxruntime writes it (model_run and node events, sizes
as strings), Memcpy node events (which only a device session has) counted per run, the
recording binding and the decode passes of the fp16 builder folder that the GPU test
measures (tests/gpu/test_slots_gpu.py), and the verdicts check_traffic gives.

The fp16 folder comes from tests/gpu/builder_fp16.py (the genai venv; `make test` makes
it first): an fp16 CUDA folder loads and runs on the CPU provider too.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.gpu import builder_fp16
from tests.gpu.slot_traffic import (
    NodeEvent,
    StepTraffic,
    check_bound_in_place,
    check_traffic,
    measure_decode,
    open_profiled,
    open_runner,
    parse_profile,
    read_profile,
)

pytestmark = pytest.mark.timeout(900)  # the genai venv, on a host that has none yet

CPU = "CPUExecutionProvider"
MEMCPY_ARGS = {
    "op_name": "MemcpyFromHost",
    "provider": "CUDAExecutionProvider",
    "output_size": "64064",
    "output_type_shape": [{"int64": [8, 1001]}],
}


def _cpu_profile(tmp_path: Path, runs: int) -> Path:
    """A real profile: ort_gpu_check's tiny model run `runs` times on the CPU."""
    from tests.gpu.ort_gpu_check import tiny_model

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "tiny")
    session = ort.InferenceSession(tiny_model(), options, providers=[CPU])
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((64, 128), dtype=np.float32),
        "w": rng.standard_normal((128, 32), dtype=np.float32),
        "b": rng.standard_normal(32, dtype=np.float32),
    }
    for _ in range(runs):
        session.run(None, feeds)
    return Path(session.end_profiling())


def test_a_cpu_profile_is_read_run_by_run(tmp_path: Path) -> None:
    runs = read_profile(_cpu_profile(tmp_path, 3))
    assert len(runs) == 3
    assert all(run.dur_us > 0 and run.nodes for run in runs)
    assert [len(run.nodes) for run in runs] == [len(runs[0].nodes)] * 3
    for run in runs:
        assert {node.provider for node in run.nodes} == {CPU}
        assert run.memcpys == []
        (last,) = [node for node in run.nodes if node.op == "ReduceSum"]
        assert last.output_shapes == (("float", (32,)),)
        assert last.output_bytes == 32 * 4


def test_memcpy_events_are_counted_in_their_run(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = json.loads(_cpu_profile(tmp_path, 3).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: int(e["ts"]))
    node = next(e for e in events if e.get("cat") == "Node" and "args" in e)
    inside = int(runs[1]["ts"]) + int(runs[1]["dur"]) // 2
    memcpy = copy.deepcopy(node)
    memcpy.update(name="Memcpy_token_0_kernel_time", ts=inside, dur=1, args=dict(MEMCPY_ARGS))
    fence = {"cat": "Node", "name": "Memcpy_token_0_fence_before", "ts": inside, "ph": "X"}
    outside = copy.deepcopy(memcpy)
    outside["ts"] = int(runs[-1]["ts"]) + int(runs[-1]["dur"]) + 1_000_000
    for wrapped in (
        [*events, memcpy, fence, outside],
        {"traceEvents": [*events, memcpy, fence, outside]},
    ):
        parsed = parse_profile(wrapped)
        assert [len(run.memcpys) for run in parsed] == [0, 1, 0]
        (copied,) = parsed[1].memcpys
        assert copied == NodeEvent(
            "Memcpy_token_0", "MemcpyFromHost", "CUDAExecutionProvider", 64064,
            (("int64", (8, 1001)),),
        )  # fmt: skip
        step = StepTraffic(1000, 8, {}, {}, [copied], set())
        assert step.is_mask_copy(copied) and step.moved == 64064 and step.moved_without_mask == 0
    with pytest.raises(ValueError, match="not an ONNX Runtime profile"):
        parse_profile("[]")


@pytest.fixture(scope="module")
def cpu_steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[StepTraffic], Any]:
    """The GPU test's decode passes on the CPU: contexts 32 and 1000, batches 1 and 8."""
    folder = builder_fp16.build()
    prefix = tmp_path_factory.mktemp("profile") / "slots"
    session = open_profiled(folder / "model.onnx", prefix, [CPU])
    runner, storage = open_runner(session, folder, slots=8, length=2048, device="cpu")
    steps = measure_decode(session, runner, 2048, contexts=(32, 1000), batches=(1, 8))
    return steps, storage


def test_decode_passes_record_what_crosses(cpu_steps: tuple[list[StepTraffic], Any]) -> None:
    steps, storage = cpu_steps
    assert [(s.context, s.batch) for s in steps] == [
        (32, 1), (33, 1), (32, 8), (33, 8), (1000, 1), (1001, 1), (1000, 8), (1001, 8),
    ]  # fmt: skip
    for step in steps:
        fed = {k: v for k, v in step.fed.items() if not k.startswith("past_key_values.")}
        assert fed == {
            "input_ids": 8 * step.batch,
            "attention_mask": 8 * step.batch * step.mask_width,
        }
        assert step.fetched["logits"] == 2 * 2048 * step.batch  # float16 logits
        assert step.memcpys == [] and step.attention_providers == {CPU}
        assert step.binding is not None
        check_bound_in_place(step.binding, storage, 0, step.batch)
    # The first pass of a binding binds the slots; on the CPU they are host memory.
    assert "past_key_values.0.key" in steps[0].fed and "past_key_values.0.key" not in steps[1].fed
    slab = storage.layout.layer_slab_bytes(0)
    with pytest.raises(AssertionError, match="crosses to or from the host"):
        check_traffic(steps, slab, CPU)


def _as_on_a_device(step: StepTraffic, **change: Any) -> StepTraffic:
    """The step as a device session records it: the slots bound on the device."""
    kv = ("past_key_values.", "present.")
    fed = {k: v for k, v in step.fed.items() if not k.startswith(kv)}
    fetched = {k: v for k, v in step.fetched.items() if not k.startswith(kv)}
    return dataclasses.replace(step, fed=fed, fetched=fetched, **change)


def test_check_traffic_verdicts(cpu_steps: tuple[list[StepTraffic], Any]) -> None:
    steps, storage = cpu_steps
    slab = storage.layout.layer_slab_bytes(0)
    device = [_as_on_a_device(step) for step in steps]
    check_traffic(device, slab, CPU)
    mask = NodeEvent("m", "MemcpyFromHost", "x", 8, (("int64", (1, 1)),))
    with_mask_copies = [
        dataclasses.replace(
            step,
            memcpys=[dataclasses.replace(
                mask, output_bytes=8 * step.batch * step.mask_width,
                output_shapes=(("int64", (step.batch, step.mask_width)),),
            )],
        )
        for step in device
    ]  # fmt: skip
    check_traffic(with_mask_copies, slab, CPU)
    kv_copy = NodeEvent("kv", "MemcpyToHost", "x", slab, (("float16", (1, 2, 2048, 64)),))
    bad = [dataclasses.replace(device[0], memcpys=[kv_copy]), *device[1:]]
    with pytest.raises(AssertionError, match="copies a KV slab"):
        check_traffic(bad, slab, CPU)
    grows = NodeEvent("grows", "MemcpyToHost", "x", 4, (("int32", (1,)),))
    bad = [
        dataclasses.replace(s, memcpys=[dataclasses.replace(grows, output_bytes=s.context)])
        for s in device
    ]
    with pytest.raises(AssertionError, match="depend on the context"):
        check_traffic(bad, slab, CPU)
    flat = [dataclasses.replace(s, fetched={}, fed={}) for s in device]
    with pytest.raises(AssertionError, match="not growing with the batch"):
        check_traffic(flat, slab, CPU)
    with pytest.raises(AssertionError, match="GroupQueryAttention ran on"):
        check_traffic(device, slab, "CUDAExecutionProvider")
