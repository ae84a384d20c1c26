"""The client's tensor codec agrees with the daemon's byte for byte, for every dtype in both
encodings, and works without ml_dtypes (bfloat16 as raw 2-byte records)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from tensord.server.tensord_v1 import codec
from tensord_client import tensors
from tensord_client.dtypes import DType, bfloat16_to_float32, float32_to_bfloat16
from tensord_client.v1 import inference_pb2 as pb
from tests.unit.server.test_codec import sample


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
@pytest.mark.parametrize("contents", [False, True], ids=["raw", "contents"])
def test_client_and_daemon_encode_alike(dtype: DType, contents: bool) -> None:
    array = sample(dtype)
    mine = tensors.encode_tensor("t", array, contents=contents)
    assert (
        mine.SerializeToString()
        == codec.encode_tensor("t", array, contents=contents).SerializeToString()
    )
    _, by_daemon = codec.decode_tensor(mine, "inputs[0]")
    by_client = tensors.decode_tensor(pb.Tensor.FromString(mine.SerializeToString()))
    assert by_client.shape == by_daemon.shape == (2, 3)
    if dtype is DType.STRING:
        assert by_client.tolist() == by_daemon.tolist() == array.tolist()
    else:
        assert by_client.dtype == by_daemon.dtype == dtype.numpy
        assert by_client.tobytes() == by_daemon.tobytes() == array.tobytes()


def test_a_dtype_the_contract_lacks_is_refused_before_sending() -> None:
    for array in (np.zeros(2, np.uint16), np.zeros(2, np.complex64), np.zeros(2, "V4")):
        with pytest.raises(ValueError, match=f"tensor 'x': NumPy dtype {array.dtype} has no"):
            tensors.encode_tensor("x", array)


def test_a_malformed_reply_names_the_tensor() -> None:
    short = pb.Tensor(name="y", dtype=pb.DATA_TYPE_FLOAT32, shape=[2], raw_data=b"\0" * 4)
    with pytest.raises(ValueError, match=r"tensor 'y': raw_data has 4 bytes; shape \[2\]"):
        tensors.decode_tensor(short)
    strings = pb.Tensor(name="s", dtype=pb.DATA_TYPE_STRING, shape=[1], raw_data=b"\5\0\0\0ab")
    with pytest.raises(ValueError, match="tensor 's': string 0 runs past the end"):
        tensors.decode_tensor(strings)
    with pytest.raises(ValueError, match="tensor 'z': DataType 99 is unknown here"):
        tensors.decode_tensor(pb.Tensor(name="z", dtype=99, shape=[0]))  # type: ignore[arg-type]


def test_bfloat16_without_ml_dtypes_matches_it() -> None:
    """The raw-record fallback converts exactly as ml_dtypes does, rounding ties to even."""
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.normal(0, 1e3, 4096).astype(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32),
            np.array([3.4e38, -3.4e38, 1e-40], np.float32),
        ]
    )
    expected = values.astype(ml_dtypes.bfloat16)
    assert float32_to_bfloat16(values).view("<u2").tolist() == expected.view("<u2").tolist()
    records = expected.view("V2")  # what a client without ml_dtypes holds
    assert bfloat16_to_float32(records).tolist() == expected.astype(np.float32).tolist()
    nan = float32_to_bfloat16(np.array([np.nan], np.float32)).astype(np.float32)
    assert np.isnan(nan).all()


def test_without_ml_dtypes_bfloat16_travels_as_raw_records() -> None:
    """In a client without ml_dtypes, bfloat16 elements are 2-byte records, encoded and
    decoded as the daemon does, and uint16 is not taken for bfloat16."""
    program = """
import sys
sys.modules["ml_dtypes"] = None  # as if it were not installed
import numpy as np
from tensord_client.dtypes import DType, from_numpy
from tensord_client.tensors import decode_tensor, encode_tensor
assert DType.BFLOAT16.numpy == np.dtype("V2"), DType.BFLOAT16.numpy
records = np.frombuffer(bytes.fromhex("c03f4040803f"), "V2")  # 1.5, 3.0, 1.0
raw, typed = encode_tensor("b", records), encode_tensor("b", records, contents=True)
assert list(typed.contents.float_values) == [1.5, 3.0, 1.0]
for tensor in (raw, typed):
    assert decode_tensor(tensor).tobytes() == records.tobytes()
try:
    from_numpy(np.dtype(np.uint16))
except ValueError:
    print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")
    # The same bytes as the daemon sends for those values.
    daemon = codec.encode_tensor(
        "b", np.array([1.5, 3.0, 1.0], np.float32).astype(ml_dtypes.bfloat16)
    )
    assert daemon.raw_data == bytes.fromhex("c03f4040803f")
