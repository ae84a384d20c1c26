"""Repository scanning and signature overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensord.backends.base import TensorSpec
from tensord.backends.signature import apply_overrides, check_batching
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.modelconfig.model import ModelConfig, TensorOverride
from tensord.registry.repository import scan_repository


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_scan_layouts(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "1" / "model.onnx")
    touch(tmp_path / "a" / "3" / "model.onnx")
    touch(tmp_path / "b" / "model.onnx")
    touch(
        tmp_path / "c" / "model.toml", 'name = "renamed"\nversions = [2]\nmodel_file = "m.onnx"\n'
    )
    touch(tmp_path / "c" / "2" / "m.onnx")
    touch(tmp_path / ".hidden" / "1" / "model.onnx")
    found = [
        (s.name, s.version, s.path.relative_to(tmp_path).as_posix(), s.error)
        for s in scan_repository(tmp_path)
    ]
    assert found == [
        ("a", 1, "a/1/model.onnx", ""),
        ("a", 3, "a/3/model.onnx", ""),
        ("b", 1, "b/model.onnx", ""),
        ("renamed", 2, "c/2/m.onnx", ""),
    ]


def test_problems_become_entries(tmp_path: Path) -> None:
    touch(tmp_path / "empty" / "model.toml")  # with nothing of a model, a directory is skipped
    touch(tmp_path / "missing" / "model.toml", "versions = [1, 2]\n")
    touch(tmp_path / "missing" / "1" / "model.onnx")
    touch(tmp_path / "nofile" / "1" / "other.onnx")
    touch(tmp_path / "badtoml" / "model.toml", "max_batch_size = 'x'\n")
    errors = {(s.name, s.version): s.error for s in scan_repository(tmp_path)}
    assert "no version directories (1/, 2/, ...) holding model.onnx" in errors[("empty", 1)]
    assert errors[("missing", 1)] == ""
    assert "model.toml lists version 2, but" in errors[("missing", 2)]
    assert "nofile/1/model.onnx does not exist; 1/ holds other.onnx" in errors[("nofile", 1)]
    assert "max_batch_size: expected a valid integer" in errors[("badtoml", 1)]


def test_repository_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="is not a directory"):
        scan_repository(tmp_path / "nope")


SPECS = [TensorSpec("x", DType.FLOAT32, (-1, -1)), TensorSpec("y", DType.INT64, (-1,))]


def test_overrides_narrow_dynamic_dims() -> None:
    out = apply_overrides(
        SPECS, [TensorOverride(name="x", dtype="float32", shape=[-1, 8])], "inputs"
    )
    assert out == [TensorSpec("x", DType.FLOAT32, (-1, 8)), SPECS[1]]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (TensorOverride(name="z"), "model.toml inputs[0] 'z': the model has no input of that name"),
        (TensorOverride(name="x", dtype="int8"), "dtype int8 does not match the model's float32"),
        (TensorOverride(name="x", shape=[1]), "shape [1] has rank 1, the model's [-1, -1] has 2"),
    ],
)
def test_bad_overrides(override: TensorOverride, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        apply_overrides(SPECS, [override], "inputs")


SHAPELESS = [
    TensorSpec("x", DType.FLOAT32, (), rank_known=False),
    TensorSpec("s", DType.FLOAT32, ()),  # a scalar: rank 0, known
]


def test_a_shapeless_input_takes_the_override_rank_and_must_have_one() -> None:
    out = apply_overrides(SHAPELESS, [TensorOverride(name="x", shape=[-1, 3])], "inputs")
    assert out == [TensorSpec("x", DType.FLOAT32, (-1, 3)), SHAPELESS[1]]
    with pytest.raises(ModelLoadError, match="input 'x' has no shape in the model, not even"):
        apply_overrides(SHAPELESS, [], "inputs")
    # A scalar keeps its rank: an override of another rank is refused.
    with pytest.raises(ModelLoadError, match="shape \\[2\\] has rank 1, the model's \\[\\] has 0"):
        apply_overrides(
            SHAPELESS,
            [TensorOverride(name="x", shape=[1]), TensorOverride(name="s", shape=[2])],
            "inputs",
        )
    # An output may stay shapeless, unless the model batches.
    assert apply_overrides(SHAPELESS, [], "outputs") == SHAPELESS
    with pytest.raises(ModelLoadError, match="'x' has no shape in the model, not even a rank"):
        check_batching(ModelConfig(max_batch_size=4), SHAPELESS[:1])


def test_batching_needs_a_dynamic_first_dimension() -> None:
    check_batching(ModelConfig(max_batch_size=4), SPECS)
    with pytest.raises(
        ModelLoadError, match="needs a dynamic first \\(batch\\) dimension, but 'f'"
    ):
        check_batching(ModelConfig(max_batch_size=4), [TensorSpec("f", DType.FLOAT32, (3, 2))])


def test_a_batching_model_on_the_host_runs_one_batch_unless_told_otherwise() -> None:
    batching = {"max_batch_size": 8, "dynamic_batching": {}}
    assert ModelConfig(**batching).instances_on("cpu") == 1
    assert ModelConfig(**batching).instances_on("cuda") == 2  # lanes overlap copies
    assert ModelConfig(**batching, instance_count=3).instances_on("cpu") == 3
    assert ModelConfig(**batching, instance_count=2).instances_on("cpu") == 2  # said, kept
    assert ModelConfig(max_batch_size=8).instances_on("cpu") == 2


def test_an_unreadable_model_toml_fails_only_that_model(tmp_path: Path) -> None:
    touch(tmp_path / "good" / "1" / "model.onnx")
    touch(tmp_path / "latin1" / "1" / "model.onnx")
    (tmp_path / "latin1" / "model.toml").write_bytes(b'name = "caf\xe9"\n')
    touch(tmp_path / "dir" / "1" / "model.onnx")
    (tmp_path / "dir" / "model.toml").mkdir()
    found = {s.name: s for s in scan_repository(tmp_path)}
    assert sorted(found) == ["dir", "good", "latin1"]
    assert found["good"].error == "" and not found["good"].whole_model
    latin1 = found["latin1"]
    assert latin1.error == (
        f"{tmp_path}/latin1/model.toml: not UTF-8 text (byte 11: invalid continuation byte); "
        "TOML files are UTF-8"
    )
    assert latin1.whole_model and latin1.model_dir == tmp_path / "latin1"
    assert found["dir"].error == f"{tmp_path}/dir/model.toml: is a directory; expected a TOML file"
    assert found["dir"].whole_model


def test_version_directories_are_ascii_numbers_from_1(tmp_path: Path) -> None:
    for name in ("²", "1x", "0", "2", "02", "3", "004"):
        touch(tmp_path / "m" / name / "model.onnx")
    found = {s.version: s for s in scan_repository(tmp_path)}
    assert sorted(found) == [0, 2, 3, 4]
    assert found[0].error == (
        f"{tmp_path}/m: 0/ is not served: versions are numbered from 1 (version 0 in a "
        "request means the newest ready version); rename it"
    )
    assert found[2].error == f"{tmp_path}/m: 02/ and 2/ are both version 2; keep one of them"
    assert found[3].error == "" and found[3].path == tmp_path / "m" / "3" / "model.onnx"
    assert found[4].error == "" and found[4].path == tmp_path / "m" / "004" / "model.onnx"


def test_two_directories_with_one_name_both_fail(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "1" / "model.onnx")
    touch(tmp_path / "a" / "model.toml", 'name = "mlp"\n')
    touch(tmp_path / "b" / "1" / "model.onnx")
    touch(tmp_path / "b" / "2" / "model.onnx")
    touch(tmp_path / "b" / "model.toml", 'name = "mlp"\n')
    touch(tmp_path / "c" / "1" / "model.onnx")
    found = [(s.name, s.version, s.error) for s in scan_repository(tmp_path)]
    reason = (
        f"model name 'mlp' is claimed by 2 directories: {tmp_path}/a and {tmp_path}/b; "
        "give each its own name (name = ... in model.toml)"
    )
    assert found == [("c", 1, ""), ("mlp", 1, reason), ("mlp", 2, reason)]


@pytest.mark.parametrize("model_file", ["/etc/passwd", "../other/model.onnx", "1/../../x.onnx", ""])
def test_model_file_stays_inside_the_directory(tmp_path: Path, model_file: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.toml").write_text(
        f"model_file = {model_file!r}\n".replace("\0", "\\u0000")
    )
    (src,) = scan_repository(tmp_path)
    assert src.whole_model and "model_file" in src.error
    assert "expected a file name inside the model's directory" in src.error


def test_symlinks_out_of_the_model_directory_need_the_option(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "model.onnx").write_bytes(b"onnx")
    repo = tmp_path / "repo"
    (repo / "linked" / "1").mkdir(parents=True)
    (repo / "linked" / "1" / "model.onnx").symlink_to(store / "model.onnx")
    (repo / "inside" / "1").mkdir(parents=True)
    (repo / "inside" / "1" / "real.onnx").write_bytes(b"onnx")
    (repo / "inside" / "1" / "model.onnx").symlink_to("real.onnx")  # stays inside: fine
    (repo / "fifo" / "1").mkdir(parents=True)
    os.mkfifo(repo / "fifo" / "1" / "model.onnx")
    errors = {src.name: src.error for src in scan_repository(repo)}
    assert errors["inside"] == ""
    assert errors["linked"] == (
        f"{repo / 'linked' / '1' / 'model.onnx'} leads to {str(store / 'model.onnx')!r}, "
        f"outside the model's directory {repo / 'linked'}; move the file in, or set "
        "follow_model_symlinks = true in the daemon's config"
    )
    assert errors["fifo"] == f"{repo / 'fifo' / '1' / 'model.onnx'} is not a regular file"
    followed = {src.name: src.error for src in scan_repository(repo, follow_symlinks=True)}
    assert followed["linked"] == ""
