"""Which CUDA errors count as sticky, from cuda-python's error codes and from error text."""

from __future__ import annotations

import pytest
from cuda.bindings import runtime as cudart

from tensord.cuda.device_fault import STICKY_CUDA_ERRORS, is_sticky, sticky_error_in
from tensord.cuda.runtime import (
    STICKY_ERRORS,
    CudaError,
    CudaOutOfMemoryError,
    StickyCudaError,
    check,
)
from tensord.errors import DeviceLostError, InternalError


def test_every_sticky_name_is_a_cuda_error_with_that_code() -> None:
    for code, name in STICKY_CUDA_ERRORS.items():
        assert int(getattr(cudart.cudaError_t, name)) == code
    assert len(STICKY_ERRORS) == len(STICKY_CUDA_ERRORS)


def test_sticky_errors_are_the_documented_relaunch_ones() -> None:
    """cuda-python carries the CUDA documentation: every error it documents as needing a
    relaunch is in the list."""
    documented = {
        int(e)
        for e in cudart.cudaError_t
        if "must be terminated and relaunched" in " ".join((e.__doc__ or "").split())
    }
    assert documented
    assert documented <= set(STICKY_CUDA_ERRORS)


def test_error_999_is_a_lost_device() -> None:
    """cudaErrorUnknown, what virtualised GPU hosts return once the device has gone."""
    with pytest.raises(StickyCudaError) as caught:
        check((cudart.cudaError_t.cudaErrorUnknown,), "cudaMemcpyAsync")
    assert isinstance(caught.value, DeviceLostError) and caught.value.sticky


def test_check_raises_sticky_errors_as_device_lost() -> None:
    illegal = cudart.cudaError_t.cudaErrorIllegalAddress
    with pytest.raises(StickyCudaError) as caught:
        check((illegal,), "cudaStreamSynchronize")
    assert isinstance(caught.value, DeviceLostError) and caught.value.sticky
    assert caught.value.message == (
        "cudaStreamSynchronize failed: cudaErrorIllegalAddress: "
        "an illegal memory access was encountered"
    )


def test_check_keeps_passing_errors_internal() -> None:
    with pytest.raises(CudaError) as caught:
        check((cudart.cudaError_t.cudaErrorInvalidValue,), "cudaMemcpyAsync")
    assert not isinstance(caught.value, DeviceLostError) and not caught.value.sticky
    assert isinstance(caught.value, InternalError)
    # A busy device (exclusive compute mode) passes: not sticky.
    with pytest.raises(CudaError) as busy:
        check((cudart.cudaError_t.cudaErrorDevicesUnavailable,), "cudaSetDevice")
    assert not isinstance(busy.value, DeviceLostError)
    with pytest.raises(CudaOutOfMemoryError):
        check((cudart.cudaError_t.cudaErrorMemoryAllocation,), "cudaMalloc")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[ONNXRuntimeError] : 1 : FAIL : CUDA failure 700: an illegal memory access was "
            "encountered ; GPU=0 ; hostname=h ; file=cuda_call.cc ; line=121 ; "
            "expr=cudaStreamSynchronize(stream);",
            "cudaErrorIllegalAddress",
        ),
        ("CUDA error 719 launching kernel", "cudaErrorLaunchFailure"),
        ("cuLaunchKernel: CUDA_ERROR_ILLEGAL_INSTRUCTION", "cudaErrorIllegalInstruction"),
        ("got cudaErrorECCUncorrectable from the device", "cudaErrorECCUncorrectable"),
        ("CUDA failure 999: unknown error ; GPU=0", "cudaErrorUnknown"),
        ("cuCtxSynchronize: CUDA_ERROR_UNKNOWN", "cudaErrorUnknown"),
        ("CUDA failure 2: out of memory", None),
        ("CUDA failure 7000: not a code", None),
        ("CUDA_ERROR_ILLEGAL_ADDRESSES", None),
        ("shape mismatch in node MatMul", None),
    ],
)
def test_sticky_error_in_text(text: str, expected: str | None) -> None:
    assert sticky_error_in(text) == expected


def test_is_sticky() -> None:
    assert is_sticky(700) and is_sticky(214)
    assert is_sticky(999)  # cudaErrorUnknown: a virtualised host's lost device
    assert not is_sticky(2) and not is_sticky(46)


def test_driver_api_errors_are_classified_like_runtime_ones() -> None:
    """A kernel launched through the driver API that faults (CUresult, not cudaError_t)
    must also end in the device-lost path, not a plain INTERNAL."""
    from cuda.bindings import driver

    from tensord.kernels.driver import DriverError, StickyDriverError, driver_error_type

    for sticky in (
        "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_UNKNOWN",
    ):  # fmt: skip
        kind = driver_error_type(getattr(driver.CUresult, sticky))
        assert kind is StickyDriverError and issubclass(kind, DeviceLostError)
    for passing in ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_FOUND"):
        assert driver_error_type(getattr(driver.CUresult, passing)) is DriverError
