"""Which CUDA errors are sticky: after them the process must restart to use the GPU again.

The list follows the CUDA runtime's documentation of `cudaError_t`: each of these "leaves
the process in an inconsistent state and any further CUDA work will return the same error.
To continue using CUDA, the process must be terminated and relaunched" (or, for the
uncorrectable ECC and NVLink errors, reports failed hardware). Errors that pass, such as
cudaErrorDevicesUnavailable (a device busy in an exclusive compute mode) or
cudaErrorMemoryAllocation, are not here: the daemon keeps serving through them.

cudaErrorUnknown (999) is here as well. The documentation does not call it sticky, but it is
what a virtualised GPU host returns once the device behind the guest has gone (a reset or
a lost passthrough): every later call fails the same way, and only a new process (on a
healthy device) serves again. Treating it as passing would leave the daemon SERVING while
every request fails.

Pure Python, so that backends which only see an error's text (ONNX Runtime's CUDA and
TensorRT providers report "CUDA failure 700: an illegal memory access was encountered")
can classify it without cuda-python.
"""

from __future__ import annotations

import re

STICKY_CUDA_ERRORS: dict[int, str] = {
    214: "cudaErrorECCUncorrectable",
    220: "cudaErrorNvlinkUncorrectable",
    226: "cudaErrorContained",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    721: "cudaErrorTensorMemoryLeak",
    810: "cudaErrorMpsClientTerminated",
    911: "cudaErrorExternalDevice",
    999: "cudaErrorUnknown",
}

# The driver API's names for the same conditions (CUDA_ERROR_ILLEGAL_ADDRESS, ...).
_DRIVER_NAMES = {
    "CUDA_ERROR_ECC_UNCORRECTABLE": 214,
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": 220,
    "CUDA_ERROR_CONTAINED": 226,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_LAUNCH_TIMEOUT": 702,
    "CUDA_ERROR_ASSERT": 710,
    "CUDA_ERROR_HARDWARE_STACK_ERROR": 714,
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": 715,
    "CUDA_ERROR_MISALIGNED_ADDRESS": 716,
    "CUDA_ERROR_INVALID_ADDRESS_SPACE": 717,
    "CUDA_ERROR_INVALID_PC": 718,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_TENSOR_MEMORY_LEAK": 721,
    "CUDA_ERROR_MPS_CLIENT_TERMINATED": 810,
    "CUDA_ERROR_EXTERNAL_DEVICE": 911,
    "CUDA_ERROR_UNKNOWN": 999,
}

_NAMES = {name: code for code, name in STICKY_CUDA_ERRORS.items()} | _DRIVER_NAMES
_NAME_PATTERN = re.compile(r"\b(" + "|".join(sorted(_NAMES, key=len, reverse=True)) + r")\b")
# ONNX Runtime's providers: "CUDA failure 700: ..." (also "CUDA error 700" elsewhere).
_CODE_PATTERN = re.compile(r"\bCUDA (?:failure|error) (\d+)\b", re.IGNORECASE)


def is_sticky(code: int) -> bool:
    """Whether a cudaError_t value means the context is lost."""
    return code in STICKY_CUDA_ERRORS


def sticky_error_in(text: str) -> str | None:
    """The runtime name of a sticky CUDA error that `text` reports, or None."""
    named = _NAME_PATTERN.search(text)
    if named:
        return STICKY_CUDA_ERRORS[_NAMES[named.group(1)]]
    for match in _CODE_PATTERN.finditer(text):
        code = int(match.group(1))
        if code in STICKY_CUDA_ERRORS:
            return STICKY_CUDA_ERRORS[code]
    return None
