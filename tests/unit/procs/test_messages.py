"""The messages between frontends and the engine: every tensor comes back as it went."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensord import errors
from tensord.dataplane import PredictCall, PredictResult
from tensord.procs import messages
from tensord.procs.messages import EngineFailure, ErrorReport, decode, encode

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


def through(message: messages.Message) -> messages.Message:
    return decode(b"".join(bytes(part) for part in encode(message)))


def test_a_call_and_a_result_cross_whole() -> None:
    call = PredictCall("m", 3, TENSORS, ["out"], 123.5)
    sent = through(messages.predict(7, call))
    assert isinstance(sent, messages.Predict) and sent.id == 7
    back = messages.call_of(sent)
    assert (back.model, back.version, back.output_names, back.deadline) == ("m", 3, ["out"], 123.5)
    for (name, sent_array), (got_name, got) in zip(TENSORS, back.inputs, strict=True):
        assert name == got_name and sent_array.dtype == got.dtype
        assert sent_array.shape == got.shape and np.array_equal(sent_array, got)
        assert not got.flags.writeable or got.dtype.kind == "O"  # views of the record
    result = PredictResult("m", 3, TENSORS, 0.25, 0.5)
    replied = through(messages.Batch([messages.result(8, result), messages.Abort(9)]))
    assert isinstance(replied, messages.Batch)
    first, second = replied.messages
    assert isinstance(first, messages.Result) and second == messages.Abort(9)
    again = messages.result_of(first)
    assert (again.queue_s, again.compute_s) == (0.25, 0.5)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(TENSORS, again.outputs, strict=True))


def test_a_call_of_strings_alone_crosses_whole() -> None:
    """Object arrays take no out-of-band buffer: a record may have none."""
    strings = np.array([[b"a", b"bc"]], dtype=object)
    sent = through(messages.predict(1, PredictCall("m", 0, [("s", strings)], [], None)))
    assert isinstance(sent, messages.Predict)
    ((name, got),) = messages.call_of(sent).inputs
    assert name == "s" and got.dtype == object and got.tolist() == [[b"a", b"bc"]]


def test_no_pickle_on_the_data_path() -> None:
    """Calls, results, generations and their tokens are MessagePack and raw tensor bytes:
    a record of them holds no pickle (whose stream starts with PROTO, 0x80)."""
    call = PredictCall("m", 3, [("x", np.ones(3, np.float32))], ["y"], None)
    record = encode(messages.Batch([messages.predict(1, call), messages.Abort(1)]))
    assert b"\x80\x05" not in b"".join(bytes(part) for part in record[:3])


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
    sent = through(messages.Error(1, ErrorReport.of(exc)))
    assert isinstance(sent, messages.Error)
    again = sent.report.exception()
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
    sent = through(messages.tokens(outputs, {"m-1": 11, "m-2": 12}))
    assert isinstance(sent, messages.Tokens)
    back = [messages.output_of(p) for p in sent.outputs]
    assert [o.request_id for o in back] == ["11", "12"]  # the frontend's call ids
    for got, sent in zip(back, outputs, strict=True):
        assert got.new_token_ids == sent.new_token_ids
        assert got.finish_status == sent.finish_status
        assert got.new_logprobs == sent.new_logprobs
    params = SamplingParams(max_tokens=4, stop=("x",)).resolve(
        GenerationDefaults(), prompt_len=2, max_model_len=16, vocab_size=32
    )
    request = EngineCoreRequest("m", 2, [1, 2], params, 10.5, 3.25, priority=-3)
    generate = through(messages.Generate(5, request))
    assert generate == messages.Generate(5, request)
