"""The messages between frontends and the engine: every tensor comes back as it went."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensord import errors
from tensord.dataplane import PredictCall, PredictResult
from tensord.procs.messages import (
    EngineFailure,
    ErrorReport,
    decode,
    encode,
    pack_call,
    pack_result,
    unpack_call,
    unpack_result,
)

TENSORS = [
    ("f16", np.arange(12, dtype=np.float16).reshape(3, 4)),
    ("bytes", np.array([b"x", b"", b"yy\x00"], dtype=object)),
    ("empty", np.zeros((0, 3), np.int64)),
    ("strided", np.arange(10, dtype=np.int32)[::2]),
    ("scalar", np.array(3.5)),
    ("bool", np.array([[True, False]])),
    ("big-endian", np.arange(4, dtype=">i4")),
    ("bfloat16", np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)),
    ("complex", np.array([1 + 2j], np.complex64)),
]


def through(message: object) -> object:
    return decode(b"".join(bytes(part) for part in encode(message)))


def test_a_call_and_a_result_cross_whole() -> None:
    call = PredictCall("m", 3, TENSORS, ["out"], 123.5)
    back = unpack_call(through(pack_call(call)))  # type: ignore[arg-type]
    assert (back.model, back.version, back.output_names, back.deadline) == ("m", 3, ["out"], 123.5)
    for (name, sent), (got_name, got) in zip(TENSORS, back.inputs, strict=True):
        assert name == got_name and sent.dtype == got.dtype and sent.shape == got.shape
        assert np.array_equal(sent, got)
    result = PredictResult("m", 3, TENSORS, 0.25, 0.5)
    again = unpack_result(through(pack_result(result)))  # type: ignore[arg-type]
    assert (again.queue_s, again.compute_s) == (0.25, 0.5)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(TENSORS, again.outputs, strict=True))


@pytest.mark.parametrize(
    "exc",
    [
        errors.InvalidArgumentError("bad shape"),
        errors.RateLimitedError("slow down", 1.5),
        errors.DeviceLostError("gone"),
        KeyError("not a status error"),
    ],
)
def test_errors_cross_with_their_status(exc: BaseException) -> None:
    again = through(ErrorReport.of(exc)).exception()  # type: ignore[attr-defined]
    if isinstance(exc, errors.TensordError):
        assert type(again) is type(exc) and again.message == exc.message
    else:  # answered as one process answers an unexpected error
        assert isinstance(again, EngineFailure) and "KeyError" in str(again)
    if isinstance(exc, errors.RateLimitedError):
        assert again.retry_after_s == 1.5


def test_generate_outputs_and_requests_cross_whole() -> None:
    from tensord.dataplane import EngineCoreRequest, TokenLogprob
    from tensord.generate.core.outputs import EngineCoreOutput
    from tensord.generate.core.request import RequestStatus
    from tensord.generate.core.sampling_params import GenerationDefaults, SamplingParams
    from tensord.procs.messages import pack_outputs, pack_request, unpack_output, unpack_request

    outputs = [
        EngineCoreOutput("m-1", [5, 6]),
        EngineCoreOutput(
            "m-2",
            [7],
            RequestStatus.FINISHED_STOPPED,
            None,
            [TokenLogprob(7, -0.5, ((7, -0.5), (3, -1.25)))],
        ),
    ]
    packed = through(pack_outputs(outputs, {"m-1": 11, "m-2": 12}))
    back = [unpack_output(p) for p in packed]  # type: ignore[attr-defined]
    assert [o.request_id for o in back] == ["11", "12"]  # the frontend's call ids
    for got, sent in zip(back, outputs, strict=True):
        assert got.new_token_ids == sent.new_token_ids
        assert got.finish_status == sent.finish_status
        assert got.new_logprobs == sent.new_logprobs
    params = SamplingParams(max_tokens=4, stop=("x",)).resolve(
        GenerationDefaults(), prompt_len=2, max_model_len=16, vocab_size=32
    )
    request = EngineCoreRequest("m", 2, [1, 2], params, 10.5, 3.25)
    assert unpack_request(through(pack_request(request))) == request  # type: ignore[arg-type]
