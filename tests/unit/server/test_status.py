"""The rate limit's trailers: the push-back key and the rich status grpcio-status carries."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from tensord.errors import RateLimitedError, ResourceExhaustedError
from tensord.server.kit.status import error_trailers


def test_other_errors_carry_no_retry_hints() -> None:
    assert error_trailers(ResourceExhaustedError("the queue is full")) == ()


def test_a_rate_limited_error_carries_the_pushback_and_the_rich_status() -> None:
    exc = RateLimitedError("slow down", 1.2345, subject="token:alice", quota="rate limit of 1")
    (pushback, (key, value)) = error_trailers(exc)
    assert pushback == ("grpc-retry-pushback-ms", "1235")
    assert key == "grpc-status-details-bin"
    assert isinstance(value, bytes)
    status = status_pb2.Status.FromString(value)
    assert (status.code, status.message) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        "slow down",
    )
    retry, quota = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
    assert status.details[0].Unpack(retry) and status.details[1].Unpack(quota)
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (1, 235_000_000)
    assert [(v.subject, v.description) for v in quota.violations] == [
        ("token:alice", "rate limit of 1")
    ]


def test_a_rate_limited_error_without_a_subject_carries_no_quota_failure() -> None:
    (pushback, (_, value)) = error_trailers(RateLimitedError("slow down", 0.995))
    assert pushback == ("grpc-retry-pushback-ms", "995")
    status = status_pb2.Status.FromString(value)
    assert [d.type_url for d in status.details] == ["type.googleapis.com/google.rpc.RetryInfo"]
