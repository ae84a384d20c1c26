"""Repository diagnostics: every entry the scan does not serve is reported with why, and a
missing model file names the .onnx files that are there and the model_file line to set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from tensord.registry.registry import ModelRegistry
from tensord.registry.repository import read_repository


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def skipped(root: Path) -> list[tuple[str, str, bool]]:
    return [
        (s.path.relative_to(root).as_posix(), s.reason, s.notable)
        for s in read_repository(root).skipped
    ]


def test_entries_that_are_not_models_are_reported_with_why(tmp_path: Path) -> None:
    touch(tmp_path / "foo.onnx")
    touch(tmp_path / "README.md")
    touch(tmp_path / ".cache" / "x")
    touch(tmp_path / "notes" / "todo.txt")
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    touch(tmp_path / "mlp" / "1" / "model.onnx")
    touch(tmp_path / "mlp" / "latest" / "model.onnx")
    touch(tmp_path / "mlp" / ".git" / "HEAD")
    touch(tmp_path / "pinned" / "model.toml", "versions = [2]\n")
    touch(tmp_path / "pinned" / "1" / "model.onnx")
    touch(tmp_path / "pinned" / "2" / "model.onnx")
    found = read_repository(tmp_path)
    assert [(s.name, s.version, s.error) for s in found.sources] == [
        ("mlp", 1, ""),
        ("pinned", 2, ""),
    ]
    assert skipped(tmp_path) == [
        (".cache", "hidden (its name starts with a dot)", False),
        ("README.md", "a file at the top of the repository, where each model is a directory", True),
        ("dangling", "a symlink that leads nowhere", True),
        (
            "foo.onnx",
            "a model file at the top of the repository, where each model is a directory: move "
            "it to foo/1/model.onnx (served as model 'foo', version 1)",
            True,
        ),
        ("lost+found", "the filesystem's lost+found directory", False),
        ("mlp/.git", "hidden (its name starts with a dot)", False),
        (
            "mlp/latest",
            "not a version directory: versions are directories named with digits (1/, 2/, ...)",
            True,
        ),
        (
            "notes",
            "a directory with no model.toml, no .onnx file and no version directory (a model "
            "is NAME/1/model.onnx, NAME/2/model.onnx, ... or NAME/model.onnx)",
            True,
        ),
        ("pinned/1", "version 1 is not in model.toml's versions [2]", True),
    ]


def test_a_missing_model_file_names_the_onnx_files_there(tmp_path: Path) -> None:
    touch(tmp_path / "resnet" / "1" / "resnet.onnx")
    touch(tmp_path / "two" / "1" / "a.onnx")
    touch(tmp_path / "two" / "1" / "b.onnx")
    touch(tmp_path / "flat" / "resnet.onnx")
    touch(tmp_path / "named" / "v1" / "model.onnx")
    touch(tmp_path / "renamed" / "model.toml", 'model_file = "m.onnx"\n')
    touch(tmp_path / "renamed" / "1" / "model.onnx")
    errors = {src.name: src.error for src in read_repository(tmp_path).sources}
    root = tmp_path
    assert errors["resnet"] == (
        f"{root}/resnet/1/model.onnx does not exist; 1/ holds resnet.onnx: set "
        f'model_file = "resnet.onnx" in {root}/resnet/model.toml'
    )
    assert errors["two"] == (
        f"{root}/two/1/model.onnx does not exist; 1/ holds a.onnx, b.onnx: set model_file to "
        f'the one to serve in {root}/two/model.toml (model_file = "a.onnx")'
    )
    assert errors["flat"] == (
        f"{root}/flat: no version directories (1/, 2/, ...) holding model.onnx, and no "
        "model.onnx beside model.toml; the model's directory holds resnet.onnx: set "
        f'model_file = "resnet.onnx" in {root}/flat/model.toml'
    )
    assert errors["named"] == (
        f"{root}/named: no version directories (1/, 2/, ...) holding model.onnx, and no "
        "model.onnx beside model.toml; v1/ is not a version directory: name them 1/, 2/, ..."
    )
    assert errors["renamed"] == (
        f"{root}/renamed/1/m.onnx does not exist; 1/ holds model.onnx: set "
        f'model_file = "model.onnx" in {root}/renamed/model.toml'
    )


def test_the_registry_logs_each_skipped_entry(tmp_path: Path) -> None:
    touch(tmp_path / "foo.onnx")
    touch(tmp_path / ".hidden")
    registry = ModelRegistry(tmp_path)
    with structlog.testing.capture_logs() as logs:
        asyncio.run(registry.load_all())
    assert [e for e in logs if e["event"] == "repository.skipped"] == [
        {
            "event": "repository.skipped",
            "log_level": "info",
            "entry": ".hidden",
            "reason": "hidden (its name starts with a dot)",
        },
        {
            "event": "repository.skipped",
            "log_level": "warning",
            "entry": "foo.onnx",
            "reason": "a model file at the top of the repository, where each model is a "
            "directory: move it to foo/1/model.onnx (served as model 'foo', version 1)",
        },
    ]
    assert registry.names() == []


def test_a_deep_model_file_without_files_fails_that_model_alone(tmp_path: Path) -> None:
    """A model.toml naming a model file deep in subdirectories, none of them there: that
    model fails with its reason; the scan goes on."""
    from tensord.registry.repository import read_repository

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.toml").write_text('model_file = "a/b/c/d/e/f/g/model.onnx"\n')
    (source,) = read_repository(tmp_path).sources
    assert source.error and "model.onnx" in source.error


def test_a_model_served_from_its_directory_still_names_stray_subdirectories(
    tmp_path: Path,
) -> None:
    from tensord.registry.repository import read_repository

    flat = tmp_path / "flat"
    (flat / "latest").mkdir(parents=True)
    (flat / "model.onnx").write_bytes(b"x")
    (flat / "latest" / "model.onnx").write_bytes(b"x")
    scan = read_repository(tmp_path)
    assert [s.path.name for s in scan.skipped if s.notable] == ["latest"]


def test_a_model_toml_outside_its_directory_is_not_read(tmp_path: Path) -> None:
    """A model.toml that symlinks lead outside the model's directory fails the model with
    the path it leads to, and nothing of that file's text."""
    from tensord.registry.repository import read_repository

    secret = tmp_path / "secret.env"
    secret.write_text('API_KEY = "hunter2"\n')
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "model.onnx").write_bytes(b"x")
    (repo / "m" / "model.toml").symlink_to(secret)
    (source,) = read_repository(repo).sources
    assert "secret.env" in source.error and "outside the model's directory" in source.error
    assert "hunter2" not in source.error and "API_KEY" not in source.error


def test_a_model_toml_in_a_symlink_loop_fails_that_model_alone(tmp_path: Path) -> None:
    from tensord.registry.repository import read_repository

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.onnx").write_bytes(b"x")
    (tmp_path / "m" / "model.toml").symlink_to(tmp_path / "m" / "model.toml")
    (source,) = read_repository(tmp_path).sources
    assert "leads nowhere" in source.error
