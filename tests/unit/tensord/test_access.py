"""What a caller may learn: server paths redacted from failure reasons, and the anonymous
caller of an open method under authentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensord.access import (
    ANONYMOUS,
    Principal,
    check_model,
    current_principal,
    may_probe,
    may_see,
    redact_paths,
    sees_server_paths,
)
from tensord.errors import PermissionDeniedError, UnauthenticatedError


def test_quoted_paths_are_redacted_whole(tmp_path: Path) -> None:
    root = tmp_path / "model repo"
    outside = '/srv/private data/alice\'s "models"/weights v2.onnx'
    reason = f"{root}/linked/1/model.onnx leads to {outside!r}, outside {root}/linked"
    assert redact_paths(reason, root) == (
        "linked/1/model.onnx leads to '.../weights v2.onnx', outside linked"
    )
    single = "'/data/it is/model.onnx' and \"/x y/z's.bin\""
    assert redact_paths(single, root) == "'.../model.onnx' and \".../z's.bin\""


def test_unquoted_paths_keep_the_last_part_up_to_a_space(tmp_path: Path) -> None:
    text = "cannot open /opt/weights/model.onnx: /usr/lib/x.so (errno 2); model's ok"
    assert redact_paths(text, tmp_path) == (
        "cannot open .../model.onnx: .../x.so (errno 2); model's ok"
    )


def test_an_anonymous_caller_probes_by_name_and_sees_no_model() -> None:
    token = current_principal.set(ANONYMOUS)
    try:
        assert not may_see("mlp") and may_probe("mlp") and not sees_server_paths()
        with pytest.raises(UnauthenticatedError) as info:
            check_model("mlp")
        assert str(info.value) == (
            "a call without a token learns the server's status only; to ask about model "
            "'mlp', send the metadata 'authorization: Bearer <token>'"
        )
    finally:
        current_principal.reset(token)
    token = current_principal.set(Principal("user", frozenset({"mlp"})))
    try:
        assert may_see("mlp") and not may_see("cnn") and not may_probe("cnn")
        with pytest.raises(PermissionDeniedError):
            check_model("cnn")
    finally:
        current_principal.reset(token)
    assert may_see("cnn") and may_probe("cnn") and sees_server_paths()  # authentication off
