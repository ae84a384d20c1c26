"""The client's records and enums follow the contract: every enum value and every field of
the replies they stand for, so a .proto change cannot leave them behind; and every status
the daemon's error table uses has its own error class."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

import tensord.errors
import tensord_client
from tensord_client import errors, results
from tensord_client.v1 import inference_pb2 as pb

ENUMS = [
    (results.ServingStatus, pb.ServingStatus, "SERVING_STATUS_"),
    (results.ModelState, pb.ModelState, "MODEL_STATE_"),
    (results.FinishReason, pb.FinishReason, "FINISH_REASON_"),
    (results.DataType, pb.DataType, "DATA_TYPE_"),
]


@pytest.mark.parametrize(
    ("enum", "proto", "prefix"), ENUMS, ids=lambda e: getattr(e, "__name__", "")
)
def test_enums_mirror_the_contract(
    enum: type[results.WireEnum], proto: object, prefix: str
) -> None:
    wire = {name.removeprefix(prefix): number for name, number in proto.items()}  # type: ignore[attr-defined]
    assert {m.value: m.number for m in enum} == wire
    for name, number in wire.items():
        member = enum.from_number(number)
        assert member is enum(name) and member == name and member == number
        assert str(member) == f"{member}" == name
    assert enum.from_number(max(wire.values()) + 1) is enum("UNSPECIFIED")  # a newer daemon's


def test_a_name_equals_its_number_but_not_other_numbers() -> None:
    serving = results.ServingStatus.SERVING
    assert serving == 1 and serving == "SERVING" and 1 == serving  # noqa: SIM300
    assert serving != 2 and serving != "NOT_SERVING" and serving != True  # noqa: E712
    assert {"SERVING": "up"}[serving] == "up"  # as a key it is its name


RECORDS = [
    (results.Health, pb.HealthResponse),
    (results.ModelHealth, pb.ModelHealth),
    (results.GenerateChunk, pb.GenerateResponse),
    (results.Usage, pb.Usage),
    (results.TokenLogprob, pb.TokenLogprob),
    (results.TopLogprob, pb.TopLogprob),
    (results.Info, pb.InfoResponse),
    (results.ModelInfo, pb.ModelInfo),
    (results.TensorSpec, pb.TensorSpec),
]


@pytest.mark.parametrize(("record", "message"), RECORDS, ids=lambda r: getattr(r, "__name__", ""))
def test_records_have_every_field_of_their_message(record: type, message: type) -> None:
    fields = [f.name for f in dataclasses.fields(record) if f.name != "proto"]
    assert fields == [f.name for f in message.DESCRIPTOR.fields]  # type: ignore[attr-defined]


def test_a_chunk_reads_its_message() -> None:
    middle = results.GenerateChunk.from_proto(
        pb.GenerateResponse(index=2, token_ids=[7], text="a", logprobs=[pb.TokenLogprob(
            token_id=7, logprob=-0.5, top=[pb.TopLogprob(token_id=7, logprob=-0.5)])])
    )  # fmt: skip
    assert (middle.index, middle.token_ids, middle.text) == (2, [7], "a")
    assert (middle.finish_reason, middle.usage) == (None, None)
    assert middle.logprobs == [results.TokenLogprob(7, -0.5, [results.TopLogprob(7, -0.5)])]
    last = results.GenerateChunk.from_proto(
        pb.GenerateResponse(
            index=3, finish_reason=pb.FINISH_REASON_STOP, usage=pb.Usage(prompt_tokens=4)
        )
    )
    assert last.finish_reason is results.FinishReason.STOP
    assert last.usage == results.Usage(4, 0, 0.0, 0.0)


def test_every_status_of_the_error_table_has_its_class() -> None:
    daemon_codes = {
        cls.code for cls in vars(tensord.errors).values()
        if isinstance(cls, type) and issubclass(cls, tensord.errors.TensordError)
    } | {grpc.StatusCode.CANCELLED}  # fmt: skip
    for code in daemon_codes:
        cls = errors.error_class(code)
        assert cls is not errors.TensordError, code
        assert cls.__name__ == code.name.title().replace("_", "")  # NOT_FOUND -> NotFound
        assert getattr(tensord_client, cls.__name__) is cls
    assert errors.error_class(grpc.StatusCode.UNKNOWN) is errors.TensordError


def test_an_error_without_a_status_is_left_as_it_is() -> None:
    bare = grpc.RpcError()
    assert errors.from_rpc_error(bare) is bare
    typed = errors.NotFound(grpc.StatusCode.NOT_FOUND, None, (("x-request-id", "r"),), "gone")
    assert errors.from_rpc_error(typed) is typed
    assert (str(typed), typed.request_id, typed.details()) == ("NOT_FOUND: gone", "r", "gone")
    limited = errors.ResourceExhausted(
        grpc.StatusCode.RESOURCE_EXHAUSTED, None, (("grpc-retry-pushback-ms", "250"),), "slow"
    )
    assert limited.retry_after == 0.25 == tensord_client.retry_after(limited)
