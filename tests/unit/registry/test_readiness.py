"""The readiness policy ([server] ready_when, `required` in model.toml) over model states,
and what a call for a version that is not READY gets."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tensord.config import ReadyWhen
from tensord.errors import FailedPreconditionError, UnavailableError
from tensord.modelconfig.model import ModelConfig
from tensord.registry.readiness import Readiness, judge
from tensord.registry.registry import ModelRegistry, not_ready_error
from tensord.registry.version import ModelState, ModelVersion, PredictVersion

READY, FAILED = ModelState.READY, ModelState.FAILED
LOADING, UNLOADING = ModelState.LOADING, ModelState.UNLOADING


def version(
    name: str, state: ModelState, number: int = 1, *, required: bool = False
) -> ModelVersion:
    config = ModelConfig(required=required)
    return PredictVersion(
        name, number, Path(f"/srv/models/{name}/{number}/model.onnx"), config, state
    )


@pytest.mark.parametrize(
    ("policy", "versions", "verdict"),
    [
        ("any_model", [], Readiness(False, "the model repository holds no model")),
        ("any_model", [version("a", FAILED)], Readiness(False, "no model is READY: 1 FAILED")),
        (
            "any_model",
            [version("a", FAILED), version("b", LOADING), version("c", FAILED)],
            Readiness(False, "no model is READY: 2 FAILED, 1 LOADING"),
        ),
        ("any_model", [version("a", FAILED), version("b", READY)], Readiness(True)),
        # One READY version is enough: version 0 finds it.
        ("all_models", [version("a", FAILED, 2), version("a", READY, 1)], Readiness(True)),
        (
            "all_models",
            [version("a", READY), version("b", FAILED), version("c", LOADING)],
            Readiness(
                False,
                "models 'b' (FAILED), 'c' (LOADING) are not READY (ready_when = all_models)",
            ),
        ),
        (
            "any_model",
            [version("a", READY), version("b", FAILED, required=True)],
            Readiness(False, "required model 'b' (FAILED) is not READY"),
        ),
        ("any_model", [version("a", READY, required=True), version("b", FAILED)], Readiness(True)),
        # A model a reload removes (every version UNLOADING) no longer counts.
        ("all_models", [version("a", READY), version("gone", UNLOADING)], Readiness(True)),
        (
            "any_model",
            [version("gone", UNLOADING, required=True)],
            Readiness(False, "the model repository holds no model"),
        ),
        ("always", [], Readiness(True)),
        ("always", [version("a", FAILED, required=True)], Readiness(True)),
    ],
)
def test_policies(policy: ReadyWhen, versions: list[ModelVersion], verdict: Readiness) -> None:
    assert judge(policy, versions) == verdict


def test_a_reason_names_five_models_at_most() -> None:
    versions = [version(f"m{i}", FAILED, required=True) for i in range(7)]
    assert judge("any_model", versions).reason == (
        "required models 'm0' (FAILED), 'm1' (FAILED), 'm2' (FAILED), 'm3' (FAILED), "
        "'m4' (FAILED) and 2 more are not READY"
    )


def test_a_failed_version_is_final_and_a_loading_one_worth_a_retry(tmp_path: Path) -> None:
    failed = version("a", FAILED)
    failed.reason = "/srv/models/a/1/model.onnx is not an ONNX model"
    error = not_ready_error(failed)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.message == (
        "model 'a' version 1 is FAILED: /srv/models/a/1/model.onnx is not an ONNX model; it "
        "serves again once fixed and the daemon reloaded (SIGHUP)"
    )
    shown = not_ready_error(failed, lambda text: text.replace("/srv/models/", ""))
    assert "is FAILED: a/1/model.onnx is not an ONNX model" in shown.message
    loading = not_ready_error(version("a", LOADING))
    assert loading.code == grpc.StatusCode.UNAVAILABLE
    assert loading.message == "model 'a' version 1 is LOADING; retry shortly"

    registry = ModelRegistry(tmp_path)
    registry._models = {
        "a": {1: failed, 2: version("a", LOADING, 2)},
        "b": {1: version("b", FAILED)},
    }
    with pytest.raises(UnavailableError):
        registry.get("a")  # version 2 is still loading: worth a retry
    with pytest.raises(FailedPreconditionError):
        registry.get("a", 1)
    with pytest.raises(FailedPreconditionError):
        registry.get("b")  # every version failed
