"""Bearer tokens on a real server: UNAUTHENTICATED, PERMISSION_DENIED, open health and
reflection, rate limits with their retry hints, re-reading the token file."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from tensord.server.auth import hash_token, token_entry
from tensord.v1 import inference_pb2 as pb
from tensord_client import Client, retry_after
from tensord_client.cli import main as tensorctl
from tests.conftest import ServerThread, serve
from tests.health_probe import HealthProbe

ADMIN = "admin-token-aaaaaaaaaaaaaaaaaaaa"
MLP_ONLY = "mlp-only-token-bbbbbbbbbbbbbbbbbb"
LIMITED = "limited-token-cccccccccccccccccc"
X = np.zeros((1, 512), np.float32)
IMAGE = np.zeros((1, 3, 32, 32), np.uint8)
Code = grpc.StatusCode


def write_tokens(path: Path) -> Path:
    path.write_text(
        token_entry("admin", hash_token(ADMIN), ["*"])
        + token_entry("mlp-only", hash_token(MLP_ONLY), ["mlp"])
        + token_entry("limited", hash_token(LIMITED), ["*"], rate=1.0, burst=2)
    )
    return path


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokens(tmp_path_factory.mktemp("auth") / "tokens.toml")


@pytest.fixture(scope="module")
def auth_server(small_repo: Path, token_file: Path) -> Iterator[ServerThread]:
    srv = serve(small_repo, auth__token_file=token_file)
    yield srv
    srv.stop()


def client(srv: ServerThread, token: str | None) -> Client:
    return Client(srv.target, timeout=10, retries=0, token=token)


def error_of(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_calls_without_a_valid_token_are_unauthenticated(auth_server: ServerThread) -> None:
    for token in (None, "wrong-token-dddddddddddddddddd"):
        with client(auth_server, token) as c:
            for call in (lambda: c.predict("mlp", {"input": X}), c.info):
                err = error_of(call)
                assert err.code() == Code.UNAUTHENTICATED
    with client(auth_server, None) as c:
        err = error_of(lambda: c.predict("mlp", {"input": X}, request_id="job-1"))
    assert err.details().startswith("missing credentials: send the metadata 'authorization")
    assert ("x-request-id", "job-1") in err.trailing_metadata()
    with client(auth_server, "wrong-token-dddddddddddddddddd") as c:
        err = error_of(lambda: list(c.generate("mlp", "hi")))
    assert err.code() == Code.UNAUTHENTICATED
    assert err.details() == "invalid bearer token: it matches no entry of the server's token file"


def test_models_outside_the_allow_list_are_permission_denied(auth_server: ServerThread) -> None:
    with client(auth_server, MLP_ONLY) as c:
        assert c.predict("mlp", {"input": X})["output"].shape == (1, 10)
        for model in ("cnn", "no-such-model"):  # an unknown model reveals nothing either
            err = error_of(lambda m=model: c.predict(m, {"image": IMAGE}))
            assert err.code() == Code.PERMISSION_DENIED
            assert err.details().startswith(f"token 'mlp-only' may not use model '{model}'")
        err = error_of(lambda: list(c.generate("cnn", "hi")))
        assert err.code() == Code.PERMISSION_DENIED
        # Info and Health list only the token's own models; Health for another is denied.
        assert [m.name for m in c.info().models] == ["mlp"]
        assert [m.name for m in c.health().models] == ["mlp"]
        assert error_of(lambda: c.health("cnn")).code() == Code.PERMISSION_DENIED
    with grpc.insecure_channel(auth_server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        bearer = (("authorization", f"Bearer {MLP_ONLY}"),)
        request = health_pb2.HealthCheckRequest(service="tensord.model.cnn")
        err = error_of(lambda: stub.Check(request, metadata=bearer))
        assert err.code() == Code.NOT_FOUND  # as an unknown service: nothing is revealed
        assert stub.Check(request).status == health_pb2.HealthCheckResponse.SERVING  # open
        mine = health_pb2.HealthCheckRequest(service="tensord.model.mlp")
        assert stub.Check(mine, metadata=bearer).status == health_pb2.HealthCheckResponse.SERVING
        listed = stub.List(health_pb2.HealthListRequest(), metadata=bearer).statuses
        assert sorted(s for s in listed if s.startswith("tensord.model.")) == ["tensord.model.mlp"]
    with client(auth_server, ADMIN) as c:
        assert len(c.info().models) == 3
        assert c.predict("cnn", {"image": IMAGE})["probabilities"].shape == (1, 10)
        assert error_of(lambda: c.predict("nope", {"x": X})).code() == Code.NOT_FOUND


def test_health_is_open_and_reflection_closed_by_default(auth_server: ServerThread) -> None:
    with client(auth_server, None) as c:  # the server's status, no model's name
        reply = c.health()
        assert reply.status == pb.SERVING_STATUS_SERVING and list(reply.models) == []
    with grpc.insecure_channel(auth_server.target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        err = error_of(lambda: list_services(channel))
        assert err.code() == Code.UNAUTHENTICATED
        assert list_services(channel, ADMIN) == [
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "inference.GRPCInferenceService",
            "tensord.v1.InferenceService",
        ]


def list_services(channel: grpc.Channel, token: str | None = None) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
        metadata=metadata,
        timeout=10,
    )
    return sorted(s.name for r in replies for s in r.list_services_response.service)


def test_closed_health_and_open_reflection(small_repo: Path, token_file: Path) -> None:
    srv = serve(
        small_repo, auth__token_file=token_file, auth__open_health=False, auth__open_reflection=1
    )
    try:
        with grpc.insecure_channel(srv.target) as channel:
            assert "tensord.v1.InferenceService" in list_services(channel)
            err = error_of(
                lambda: health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            )
            assert err.code() == Code.UNAUTHENTICATED
        with client(srv, None) as c:
            assert error_of(c.health).code() == Code.UNAUTHENTICATED
        with client(srv, MLP_ONLY) as c:
            assert c.health().status == pb.SERVING_STATUS_SERVING
            assert [m.name for m in c.health("mlp").models] == ["mlp"]
            assert error_of(lambda: c.health("cnn")).code() == Code.PERMISSION_DENIED
    finally:
        srv.stop()


def test_rate_limit_answers_resource_exhausted_with_a_retry_hint(
    auth_server: ServerThread,
) -> None:
    with client(auth_server, LIMITED) as c:  # 1 request/s, burst 2: the third call waits
        c.predict("mlp", {"input": X})
        c.predict("mlp", {"input": X})
        err = error_of(lambda: c.predict("mlp", {"input": X}))
        assert err.code() == Code.RESOURCE_EXHAUSTED
        assert err.details().startswith(
            "token 'limited' is over its rate limit of 1 requests/s (burst 2); retry in "
        )
        wait = retry_after(err)
        assert wait is not None and 0 < wait <= 1.0
        assert err.details().endswith(f"retry in {wait:.3f} s")
        trailers = dict(err.trailing_metadata())
        status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
        assert (status.code, status.message) == (Code.RESOURCE_EXHAUSTED.value[0], err.details())
        info = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(info)
        assert info.retry_delay.ToMilliseconds() == int(trailers["grpc-retry-pushback-ms"])
        assert rpc_status.from_call(err) == status  # what grpcio-status reads back
        quota = error_details_pb2.QuotaFailure()
        assert status.details[1].Unpack(quota)
        assert [(v.subject, v.description) for v in quota.violations] == [
            ("token:limited", "rate limit of 1 requests/s (burst 2)")
        ]
        time.sleep(wait)
        assert c.predict("mlp", {"input": X})["output"].shape == (1, 10)
    with client(auth_server, ADMIN) as c:  # other tokens are not held back
        for _ in range(5):
            c.predict("mlp", {"input": X})


@pytest.mark.in_process  # reaches into the server object
def test_reload_reads_the_token_file_again(small_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(token_entry("admin", hash_token(ADMIN), ["*"]))
    srv = serve(small_repo, auth__token_file=path)
    try:
        assert srv.server is not None
        with client(srv, ADMIN) as c:
            c.predict("mlp", {"input": X})
        path.write_text(token_entry("mlp-only", hash_token(MLP_ONLY), ["mlp"]))
        result = srv.call(srv.server.reload())  # what SIGHUP does: the hooks re-read files
        assert result.ok and not result.hook_errors
        with client(srv, ADMIN) as c:
            assert error_of(lambda: c.predict("mlp", {"input": X})).code() == Code.UNAUTHENTICATED
        with client(srv, MLP_ONLY) as c:
            c.predict("mlp", {"input": X})
    finally:
        srv.stop()


def test_tensorctl_sends_the_token(
    auth_server: ServerThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tensorctl(["--target", auth_server.target, "info"]) == 1
    assert "tensorctl: UNAUTHENTICATED: missing credentials" in capsys.readouterr().err
    assert tensorctl(["--target", auth_server.target, "--token", ADMIN, "--json", "info"]) == 0
    monkeypatch.setenv("TENSORD_TOKEN", MLP_ONLY)
    args = ["--target", auth_server.target, "predict", "cnn", "-i", "image=[[[[0]]]]"]
    assert tensorctl(args) == 1
    assert "PERMISSION_DENIED: token 'mlp-only' may not use model 'cnn'" in capsys.readouterr().err


def test_failure_reasons_show_server_paths_only_to_operators(
    small_repo: Path, tmp_path: Path
) -> None:
    """Health never shows server paths; Info, and the FAILED_PRECONDITION a failed model
    answers, show them with authentication off or to a token allowed every model, and
    repository-relative to any other."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(small_repo, repo)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        token_entry("admin", hash_token(ADMIN), ["*"])
        + token_entry("two", hash_token(MLP_ONLY), ["mlp", "broken"])
    )
    absolute = str(repo.resolve())
    srv = serve(repo, auth__token_file=tokens)
    try:
        for token in (MLP_ONLY, ADMIN):
            with client(srv, token) as c:
                (broken,) = [m for m in c.health().models if m.name == "broken"]
                assert "broken/1/model.onnx" in broken.reason
                assert absolute not in broken.reason and "/tmp/" not in broken.reason
        with client(srv, MLP_ONLY) as c:
            (broken,) = [m for m in c.info().models if m.name == "broken"]
            assert "broken/1/model.onnx" in broken.reason and absolute not in broken.reason
            err = error_of(lambda: c.predict("broken", {"input": X}))
            assert err.code() == Code.FAILED_PRECONDITION
            assert err.details().startswith("model 'broken' version 1 is FAILED: ")
            assert "broken/1/model.onnx" in err.details()
            assert absolute not in err.details() and "/tmp/" not in err.details()
            err = error_of(lambda: list(c.generate("broken", "hi")))
            assert err.code() == Code.FAILED_PRECONDITION and absolute not in err.details()
        with client(srv, ADMIN) as c:
            (broken,) = [m for m in c.info().models if m.name == "broken"]
            assert f"{absolute}/broken/1/model.onnx" in broken.reason
            err = error_of(lambda: c.predict("broken", {"input": X}))
            assert err.code() == Code.FAILED_PRECONDITION
            assert f"{absolute}/broken/1/model.onnx" in err.details()
    finally:
        srv.stop()
    open_srv = serve(repo)
    try:
        with client(open_srv, None) as c:
            (broken,) = [m for m in c.info().models if m.name == "broken"]
            assert f"{absolute}/broken/1/model.onnx" in broken.reason
            err = error_of(lambda: c.predict("broken", {"input": X}))
            assert f"{absolute}/broken/1/model.onnx" in err.details()
    finally:
        open_srv.stop()


def test_an_anonymous_caller_learns_the_server_status_and_no_model(
    auth_server: ServerThread,
) -> None:
    """With authentication on, open health without a token: the server's own services and
    status, no model list; a model named in grpc.health.v1 Check is answered (load
    balancers probe by name), InferenceService/Health of a model needs a token."""
    with client(auth_server, None) as c:
        assert list(c.health().models) == []
        err = error_of(lambda: c.health("mlp"))
        assert err.code() == Code.UNAUTHENTICATED
        assert err.details() == (
            "a call without a token learns the server's status only; to ask about model "
            "'mlp', send the metadata 'authorization: Bearer <token>'"
        )
        assert error_of(lambda: c.health("no-such-model")).details() == err.details().replace(
            "'mlp'", "'no-such-model'"
        )
    with grpc.insecure_channel(auth_server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        listed = stub.List(health_pb2.HealthListRequest(), timeout=10).statuses
        assert sorted(listed) == ["", "tensord.v1.InferenceService"]
        probe = health_pb2.HealthCheckRequest(service="tensord.model.cnn")
        assert stub.Check(probe, timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        unknown = health_pb2.HealthCheckRequest(service="tensord.model.nope")
        assert error_of(lambda: stub.Check(unknown, timeout=10)).code() == Code.NOT_FOUND
        watch = stub.Watch(probe, timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        bearer = (("authorization", f"Bearer {MLP_ONLY}"),)  # the same caller with its token
        listed = stub.List(health_pb2.HealthListRequest(), metadata=bearer, timeout=10).statuses
        assert sorted(listed) == ["", "tensord.model.mlp", "tensord.v1.InferenceService"]
    with client(auth_server, MLP_ONLY) as c:
        assert [m.name for m in c.health().models] == ["mlp"]


def test_not_found_names_only_the_models_the_token_may_use(
    small_repo: Path, tmp_path: Path
) -> None:
    """A token allowed a model that does not exist asks for it: NOT_FOUND lists the
    models it may use, not every model of the server."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        token_entry("user", hash_token(MLP_ONLY), ["mlp", "retired"])
        + token_entry("admin", hash_token(ADMIN), ["*"])
    )
    srv = serve(small_repo, auth__token_file=tokens)
    try:
        with client(srv, MLP_ONLY) as c:
            for call in (lambda: c.predict("retired", {"input": X}), lambda: c.health("retired")):
                err = error_of(call)
                assert err.code() == Code.NOT_FOUND
                assert err.details() == "model 'retired' not found; models: mlp"
        with client(srv, ADMIN) as c:
            err = error_of(lambda: c.health("retired"))
            assert err.details() == "model 'retired' not found; models: cnn, mlp, mlp_batched"
    finally:
        srv.stop()


def test_a_failure_reason_hides_a_path_with_spaces_and_quotes(
    small_repo: Path, tmp_path: Path
) -> None:
    """A model file symlinked out of the repository, to a path with spaces and quotes: the
    reason shows only the file's name to a token that is not an operator's, whole."""
    import os
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(small_repo / "mlp", repo / "mlp")
    outside = tmp_path / "private data" / 'alice\'s "models"'
    outside.mkdir(parents=True)
    shutil.copy(small_repo / "mlp" / "1" / "model.onnx", outside / "weights.onnx")
    (repo / "linked" / "1").mkdir(parents=True)
    os.symlink(outside / "weights.onnx", repo / "linked" / "1" / "model.onnx")
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        token_entry("user", hash_token(MLP_ONLY), ["linked"])
        + token_entry("admin", hash_token(ADMIN), ["*"])
    )
    expected = (
        "linked/1/model.onnx leads to '.../weights.onnx', outside the model's directory "
        "linked; move the file in, or set follow_model_symlinks = true in the daemon's config"
    )
    srv = serve(repo, auth__token_file=tokens)
    try:
        with client(srv, MLP_ONLY) as c:
            assert [(m.name, m.reason) for m in c.health().models] == [("linked", expected)]
            assert [(m.name, m.reason) for m in c.info().models] == [("linked", expected)]
        with client(srv, ADMIN) as c:
            (linked,) = [m for m in c.info().models if m.name == "linked"]
            assert repr(str((outside / "weights.onnx").resolve())) in linked.reason
            (linked,) = [m for m in c.health().models if m.name == "linked"]
            assert linked.reason == expected
    finally:
        srv.stop()


@pytest.mark.in_process  # reaches into the server object
def test_a_large_token_file_is_read_off_the_event_loop(small_repo: Path, tmp_path: Path) -> None:
    """A token file of 30 000 entries (3.6 MB) takes one to three seconds to read; the
    reload reads it on a worker thread, and calls are answered meanwhile. Read on the loop,
    it would hold one Health call for nearly the whole reload, so no call may take half of
    the reload's time (a bound that grows with the host's load, as the read does)."""
    import asyncio

    path = tmp_path / "tokens.toml"
    users = (token_entry(f"user-{i}", f"{i:064x}", ["mlp"]) for i in range(30_000))
    path.write_text(token_entry("admin", hash_token(ADMIN), ["*"]) + "".join(users))
    srv = serve(small_repo, auth__token_file=path)
    try:
        assert srv.server is not None
        with HealthProbe(srv.target) as probe:
            start = time.monotonic()
            reload = asyncio.run_coroutine_threadsafe(srv.server.reload(), srv.loop)
            assert reload.result(60).ok
            end = time.monotonic()
            record = probe.stop()
        what = f"a reload of {end - start:.2f} s"
        during = record.assert_answered(start, end, within_s=(end - start) / 2, what=what)
        answered = [c for c in during if c.end <= end]
        assert len(answered) >= 5, f"{what}: only {len(answered)} Health calls answered in it"
    finally:
        srv.stop()
