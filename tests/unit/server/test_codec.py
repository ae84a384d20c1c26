"""The tensor codec: both encodings for every dtype, and every malformed-tensor message."""

from __future__ import annotations

import numpy as np
import pytest

from tensord.dtypes import DType
from tensord.errors import InvalidArgumentError
from tensord.server.tensord_v1.codec import decode_tensor, encode_raw_strings, encode_tensor
from tensord.v1 import inference_pb2 as pb


def sample(dtype: DType, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    rng = np.random.default_rng(int(dtype))
    if dtype is DType.STRING:
        return np.array([f"s{i}é" for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    if dtype is DType.BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.numpy.kind in "iu":
        info = np.iinfo(dtype.numpy)
        return rng.integers(info.min, info.max, shape, dtype=dtype.numpy, endpoint=True)
    return rng.normal(0, 100, shape).astype(dtype.numpy)


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
@pytest.mark.parametrize("contents", [False, True], ids=["raw", "contents"])
def test_round_trip_is_exact(dtype: DType, contents: bool) -> None:
    array = sample(dtype)
    tensor = pb.Tensor.FromString(encode_tensor("t", array, contents=contents).SerializeToString())
    assert tensor.WhichOneof("data") == ("contents" if contents else "raw_data")
    name, decoded = decode_tensor(tensor, "inputs[0]")
    assert name == "t"
    assert decoded.shape == (2, 3)
    if dtype is DType.STRING:
        assert decoded.tolist() == array.tolist()
    else:
        assert decoded.dtype == dtype.numpy
        assert decoded.tobytes() == array.tobytes()


def test_raw_is_little_endian_c_order() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T  # a non-contiguous view
    tensor = encode_tensor("t", array)
    assert list(tensor.shape) == [3, 2]
    assert tensor.raw_data == np.ascontiguousarray(array).astype("<i4").tobytes()
    assert tensor.raw_data[:8] == b"\x00\x00\x00\x00\x03\x00\x00\x00"


def test_string_raw_layout() -> None:
    assert (
        encode_raw_strings(["ab", b"", "é"])
        == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    )


def test_zero_size_tensor_needs_no_data() -> None:
    _, array = decode_tensor(
        pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[0, 512]), "inputs[0]"
    )
    assert array.shape == (0, 512) and array.dtype == np.float32


def test_scalar_has_one_element() -> None:
    tensor = pb.Tensor(name="s", dtype=pb.DATA_TYPE_INT64, shape=[], raw_data=b"\x07" + b"\x00" * 7)
    assert decode_tensor(tensor, "inputs[0]")[1].tolist() == 7


def bad(tensor: pb.Tensor) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        decode_tensor(tensor, "inputs[0]")
    return info.value.message


def test_unset_dtype_lists_the_choices() -> None:
    msg = bad(pb.Tensor(name="x", shape=[1], raw_data=b"\0" * 4))
    assert msg.startswith("inputs[0] 'x': dtype is not set; expected one of DATA_TYPE_BOOL")


def test_unknown_dtype_number() -> None:
    assert "dtype 99 is unknown" in bad(pb.Tensor(name="x", dtype=99, shape=[1], raw_data=b"\0"))


def test_negative_dimension() -> None:
    msg = bad(pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[1, -2], raw_data=b""))
    assert (
        msg == "inputs[0] 'x': shape [1, -2] has a negative dimension; every dimension must be >= 0"
    )


def test_byte_length_mismatch_names_both_counts() -> None:
    msg = bad(pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[2, 3], raw_data=b"\0" * 20))
    assert msg == (
        "inputs[0] 'x': raw_data has 20 bytes, but shape [2, 3] of DATA_TYPE_FLOAT32 needs 24 "
        "(6 elements x 4 bytes)"
    )


def test_missing_data_for_non_empty_shape() -> None:
    msg = bad(pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[1, 512]))
    assert msg == (
        "inputs[0] 'x': no data for shape [1, 512] (512 elements); set 2048 bytes of raw_data "
        "or contents.float_values"
    )


def test_contents_in_the_wrong_field() -> None:
    tensor = pb.Tensor(
        name="x",
        dtype=pb.DATA_TYPE_FLOAT32,
        shape=[2],
        contents=pb.TensorContents(int_values=[1, 2]),
    )
    assert bad(tensor) == (
        "inputs[0] 'x': contents.int_values is set, but a DATA_TYPE_FLOAT32 tensor takes its "
        "values in contents.float_values"
    )


def test_contents_count_mismatch() -> None:
    tensor = pb.Tensor(
        name="x",
        dtype=pb.DATA_TYPE_INT64,
        shape=[2, 2],
        contents=pb.TensorContents(int64_values=[1, 2, 3]),
    )
    assert (
        bad(tensor) == "inputs[0] 'x': contents.int64_values has 3 values, but shape [2, 2] needs 4"
    )


def test_contents_out_of_range_for_int8() -> None:
    tensor = pb.Tensor(
        name="x",
        dtype=pb.DATA_TYPE_INT8,
        shape=[3],
        contents=pb.TensorContents(int_values=[1, 200, -3]),
    )
    assert bad(tensor) == (
        "inputs[0] 'x': contents.int_values[1] = 200 is out of range for DATA_TYPE_INT8 [-128, 127]"
    )


def test_truncated_string_raw_data() -> None:
    tensor = pb.Tensor(
        name="s", dtype=pb.DATA_TYPE_STRING, shape=[1], raw_data=b"\x05\x00\x00\x00abc"
    )
    assert bad(tensor) == "inputs[0] 's': element 0 claims 5 bytes but only 3 remain"


def test_more_strings_than_raw_data_can_hold() -> None:
    # Each string takes at least its 4-byte length: 7 bytes cannot hold 2 (nor 2**40).
    for count in (2, 2**40):
        tensor = pb.Tensor(
            name="s", dtype=pb.DATA_TYPE_STRING, shape=[count], raw_data=b"\x05\x00\x00\x00abc"
        )
        assert bad(tensor).startswith(
            f"inputs[0] 's': raw_data has 7 bytes, too few for {count} strings"
        )


def test_string_raw_data_with_trailing_bytes() -> None:
    raw = encode_raw_strings(["a"]) + b"zz"
    tensor = pb.Tensor(name="s", dtype=pb.DATA_TYPE_STRING, shape=[1], raw_data=raw)
    assert bad(tensor) == "inputs[0] 's': raw_data has 2 bytes left over after 1 strings"


def test_float16_contents_round_to_half() -> None:
    tensor = pb.Tensor(
        name="h",
        dtype=pb.DATA_TYPE_FLOAT16,
        shape=[2],
        contents=pb.TensorContents(float_values=[0.1, 65504.0]),
    )
    decoded = decode_tensor(tensor, "inputs[0]")[1]
    assert decoded.dtype == np.float16
    assert decoded.tolist() == [np.float16(0.1), 65504.0]


def test_float16_contents_out_of_range_are_refused_quietly(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """A finite float beyond float16's range is refused, as an int out of range is (no
    RuntimeWarning on the way); infinities stay infinities."""
    tensor = pb.Tensor(
        name="h", dtype=pb.DATA_TYPE_FLOAT16, shape=[3],
        contents=pb.TensorContents(float_values=[1.0, float("inf"), 1e10]),
    )  # fmt: skip
    assert bad(tensor) == (
        "inputs[0] 'h': contents.float_values[2] = 1e+10 is out of range for DATA_TYPE_FLOAT16 "
        "(largest 65504)"
    )
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_large_typed_contents_convert_in_chunks_to_the_same_values() -> None:
    values = (np.arange(200_000, dtype=np.float32) - 7.5) / 3
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[200_000])
    tensor.contents.float_values.extend(values.tolist())
    assert np.array_equal(decode_tensor(tensor, "inputs[0]")[1], values)
    back = encode_tensor("x", values, contents=True)
    assert np.array_equal(np.array(back.contents.float_values, np.float32), values)


def test_strings_must_be_utf8() -> None:
    tensor = pb.Tensor(
        name="s", dtype=pb.DATA_TYPE_STRING, shape=[1], raw_data=encode_raw_strings([b"\xff"])
    )
    assert (
        bad(tensor)
        == "inputs[0] 's': string element 0 is not valid UTF-8 (invalid start byte at byte 0)"
    )
