"""Execution provider planning: priority, preferred, CPU last, and the silent fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensord.backends.providers import ProviderPlan, explain_actual, plan_providers
from tensord.modelconfig.providers import PRIORITY, normalise_provider

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


def test_priority_order() -> None:
    assert PRIORITY[0] == TRT and PRIORITY[1] == CUDA and PRIORITY[-1] == CPU


def test_cpu_only_build() -> None:
    plan = plan_providers([CPU])
    assert plan == ProviderPlan((CPU,), f"highest priority available: {CPU}")


def test_gpu_build_orders_by_priority() -> None:
    plan = plan_providers([CPU, CUDA, TRT])
    assert plan.providers == (TRT, CUDA, CPU)


def test_preferred_available_goes_first() -> None:
    plan = plan_providers([CPU, CUDA, TRT], preferred=CUDA)
    assert plan.providers == (CUDA, TRT, CPU)
    assert plan.reason == f"preferred provider {CUDA} is available"


def test_preferred_missing_falls_back_with_a_reason() -> None:
    plan = plan_providers([CPU], preferred=CUDA)
    assert plan.providers == (CPU,)
    assert plan.reason == (
        f"preferred provider {CUDA} is not available in this ONNX Runtime build "
        f"(available: {CPU}); using {CPU}"
    )


def test_explicit_order_keeps_cpu_last() -> None:
    assert plan_providers([CPU, CUDA, TRT], order=[CUDA]).providers == (CUDA, CPU)


def test_silent_fallback_is_reported() -> None:
    plan = plan_providers([CPU, CUDA])
    assert explain_actual(plan, [CUDA, CPU]) == plan.reason
    assert explain_actual(plan, [CPU]) == (
        f"{plan.reason}; {CUDA} failed to start in ONNX Runtime, which fell back to {CPU} "
        "(see the ONNX Runtime warnings in the log)"
    )


@pytest.mark.parametrize(
    ("alias", "full"),
    [("cuda", CUDA), ("TensorRT", TRT), ("dml", "DmlExecutionProvider"), (CPU, CPU)],
)
def test_aliases(alias: str, full: str) -> None:
    assert normalise_provider(alias) == full


def test_unknown_alias() -> None:
    with pytest.raises(ValueError, match="unknown execution provider 'npu'"):
        normalise_provider("npu")


def test_executor_choice_falls_back_to_cpu() -> None:
    from tensord.backends.base import TensorSpec
    from tensord.devices import GpuDevice, GpuReport
    from tensord.dtypes import DType
    from tensord.executor.select import executor_choice

    floats = [TensorSpec("x", DType.FLOAT32, (-1, 4))]
    no_gpu = GpuReport(unavailable_reason="no NVIDIA driver is installed")
    gpu = GpuReport([GpuDevice(0, "NVIDIA H100", 80 << 30, "9.0")], "13.0", "13.0")
    assert executor_choice(CPU, gpu, floats) == (
        "cpu", f"the model runs on {CPU}, so its batches stay in host memory",
    )  # fmt: skip
    assert executor_choice(CUDA, no_gpu, floats) == (
        "cpu", "no usable CUDA device (no NVIDIA driver is installed)",
    )  # fmt: skip
    strings = [TensorSpec("s", DType.STRING, (-1,))]
    assert executor_choice(CUDA, gpu, strings)[0] == "cpu"
    assert executor_choice(TRT, gpu, floats) == (
        "cuda", f"{TRT} on NVIDIA H100: batches are pipelined over CUDA streams",
    )  # fmt: skip


def test_lanes_must_run_where_the_first_session_ran() -> None:
    from tensord.executor.select import lanes_disagree

    assert lanes_disagree(CUDA, [CUDA, CUDA]) == ""
    assert lanes_disagree(CUDA, [CUDA, CPU]) == (
        f"lane 1's session started on {CPU}, not on {CUDA} as the model's first session did"
    )
    assert lanes_disagree(TRT, [CUDA]).startswith(f"lane 0's session started on {CUDA}")


def test_this_host_gets_the_executor_its_devices_allow() -> None:
    from tensord.devices import probe_gpus

    report = probe_gpus()
    assert bool(report.gpus) != bool(report.unavailable_reason)


def test_provider_options_carry_the_lane_stream_and_tensorrt_flags(tmp_path: Path) -> None:
    from tensord.backends.base import DeviceOptions
    from tensord.backends.onnxruntime import provider_options
    from tensord.modelconfig.model import ModelConfig, TensorRTConfig

    config = ModelConfig(tensorrt=TensorRTConfig(fp16=True, timing_cache=False))
    where = DeviceOptions(device_id=1, cuda_stream=0x7F00DEAD, cache_directory=tmp_path)
    options = dict(provider_options([TRT, CUDA, CPU], config, where))
    stream = {"device_id": "1", "user_compute_stream": "2130763437"}
    assert options[CUDA] == stream | {"has_user_compute_stream": "1", "use_tf32": "0"}
    # ONNX Runtime's Python binding takes the TensorRT provider's flags as True/False only.
    assert options[TRT] == stream | {
        "trt_fp16_enable": "True",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(tmp_path / "tensorrt"),
    }
    assert options[CPU] == {}
    tf32 = dict(provider_options([CUDA], ModelConfig(cuda_tf32=True), DeviceOptions()))
    assert tf32[CUDA] == {"device_id": "0", "use_tf32": "1"}
