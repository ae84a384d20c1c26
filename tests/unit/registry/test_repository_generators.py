"""Generators in the model repository: detected with no model.toml, and the [generator] table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensord.errors import ModelLoadError
from tensord.generate.engine.handoff import stream_interval
from tensord.modelconfig.generator import (
    DEFAULT_KV_CACHE_BYTES,
    GeneratorConfig,
    GeneratorLimits,
)
from tensord.registry.repository import VersionSource, scan_repository

GENERATOR_FILES = ("model.onnx", "config.json", "tokenizer.json")


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def generator(directory: Path) -> None:
    for name in GENERATOR_FILES:
        touch(directory / name, "{}")


def scan(root: Path) -> dict[tuple[str, int], VersionSource]:
    return {(s.name, s.version): s for s in scan_repository(root)}


def test_detected_without_model_toml(tmp_path: Path) -> None:
    generator(tmp_path / "flat")
    generator(tmp_path / "versioned" / "1")
    generator(tmp_path / "versioned" / "2")
    touch(tmp_path / "plain" / "1" / "model.onnx")
    touch(tmp_path / "half" / "model.onnx")  # config.json alone is not a generator
    touch(tmp_path / "half" / "config.json", "{}")
    found = scan(tmp_path)
    assert {k: (s.kind, s.error) for k, s in found.items()} == {
        ("flat", 1): ("generator", ""),
        ("versioned", 1): ("generator", ""),
        ("versioned", 2): ("generator", ""),
        ("plain", 1): ("predict", ""),
        ("half", 1): ("predict", ""),
    }
    flat = found[("flat", 1)]
    assert flat.path == tmp_path / "flat" / "model.onnx"
    assert flat.directory == tmp_path / "flat"
    assert flat.config.generator == GeneratorConfig()
    assert found[("versioned", 2)].directory == tmp_path / "versioned" / "2"
    assert found[("plain", 1)].config.generator is None


def test_generator_table_sets_limits(tmp_path: Path) -> None:
    generator(tmp_path / "lm")
    touch(
        tmp_path / "lm" / "model.toml",
        "[generator]\nblock_size = 32\nnum_blocks = 100\nmax_num_seqs = 8\n"
        "max_num_batched_tokens = 512\nmax_queue_size = 4\nmax_model_len = 1024\n"
        "intra_op_threads = 2\nstream_interval = 3\n",
    )
    (source,) = scan_repository(tmp_path)
    assert (source.kind, source.error) == ("generator", "")
    assert source.config.generator == GeneratorConfig(
        block_size=32,
        num_blocks=100,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_queue_size=4,
        max_model_len=1024,
        intra_op_threads=2,
        stream_interval=3,
    )
    assert (
        source.config.generator.resolve(context_length=2048, kv_bytes_per_token=8).stream_interval
        == 3
    )


def test_explicit_kinds(tmp_path: Path) -> None:
    generator(tmp_path / "as_predict")
    touch(tmp_path / "as_predict" / "model.toml", 'kind = "predict"\n')
    touch(tmp_path / "incomplete" / "1" / "model.onnx")
    touch(tmp_path / "incomplete" / "1" / "config.json")
    touch(tmp_path / "incomplete" / "model.toml", 'kind = "generator"\n')
    touch(tmp_path / "table_only" / "1" / "model.onnx")
    touch(tmp_path / "table_only" / "model.toml", "[generator]\nblock_size = 8\n")
    found = scan(tmp_path)
    assert found[("as_predict", 1)].kind == "predict"
    assert found[("as_predict", 1)].error == ""
    incomplete = found[("incomplete", 1)]
    assert incomplete.kind == "generator"
    assert incomplete.error == (
        f"{tmp_path / 'incomplete' / '1'}: a generator needs tokenizer.json and config.json "
        "(an Optimum export) or genai_config.json (a model-builder folder) beside model.onnx; "
        "tokenizer.json is missing"
    )
    # A [generator] table makes the kind "generator", so the missing files are reported.
    assert "tokenizer.json, config.json or genai_config.json is missing" in (
        found[("table_only", 1)].error
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[generator]\nkv_cache_bytes = 1000000\nnum_blocks = 10\n",
            "set kv_cache_bytes or num_blocks, not both",
        ),
        (
            'kind = "predict"\n[generator]\nblock_size = 16\n',
            'a [generator] table needs kind = "generator"',
        ),
        (
            'kind = "generator"\nmax_batch_size = 8\n[dynamic_batching]\n',
            "[dynamic_batching] is for predict models",
        ),
        (
            "[generator]\nmax_num_seqs = 64\nmax_num_batched_tokens = 32\n",
            "max_num_batched_tokens (32) must be at least max_num_seqs (64)",
        ),
        ("[generator]\nblock_size = 0\n", "generator.block_size: expected a value greater than"),
        ("[generator]\nmax_blocks = 3\n", "generator.max_blocks: unknown key"),
        ('kind = "encoder"\n', "kind: expected 'predict', 'generator' or 'embedding'"),
        ("[generator]\nstream_interval = 0\n", "generator.stream_interval"),
        ('[generator]\nstream_interval = "often"\n', "generator.stream_interval"),
    ],
)
def test_bad_generator_settings(tmp_path: Path, toml: str, message: str) -> None:
    generator(tmp_path / "lm")
    touch(tmp_path / "lm" / "model.toml", toml)
    (source,) = scan_repository(tmp_path)
    assert message in source.error


def test_predict_settings_on_a_generator_are_refused(tmp_path: Path) -> None:
    generator(tmp_path / "detected")  # recognised from its files
    touch(
        tmp_path / "detected" / "model.toml",
        'max_batch_size = 8\ninstance_count = 4\nbackend = "tensorrt"\n'
        '[postprocess]\nkind = "topk"\nk = 3\n',
    )
    generator(tmp_path / "named" / "1")
    touch(tmp_path / "named" / "model.toml", 'kind = "generator"\nintra_op_threads = 4\n')
    generator(tmp_path / "fine")  # settings a generator uses, and defaults spelled out
    touch(
        tmp_path / "fine" / "model.toml",
        'backend = "onnxruntime"\nmax_batch_size = 0\nwarmup = false\n[generator]\n',
    )
    found = scan(tmp_path)
    detected = found[("detected", 1)]
    assert detected.whole_model and detected.kind == "generator"
    assert detected.error == (
        f"{tmp_path}/detected/model.toml: "
        "backend is not used by a generator (a generator runs on ONNX Runtime; backend = "
        '"tensorrt" is for predict models); '
        "instance_count is not used by a generator (a generator runs one engine; "
        "generator.max_num_seqs bounds its sequences); "
        "max_batch_size is not used by a generator (a generator batches continuously; its "
        "limits are in [generator]); "
        "[postprocess] is not used by a generator (pre- and postprocessing are for predict "
        "models)"
    )
    assert found[("named", 1)].error == (
        f"{tmp_path}/named/model.toml: intra_op_threads is not used by a generator (set "
        "generator.intra_op_threads instead)"
    )
    assert found[("fine", 1)].error == ""


def test_resolve_defaults() -> None:
    # The demo generator: 4 layers x 2 KV heads x 64 x float32, keys and values.
    limits = GeneratorConfig().resolve(context_length=2048, kv_bytes_per_token=4096)
    assert limits == GeneratorLimits(
        block_size=16,
        num_blocks=DEFAULT_KV_CACHE_BYTES // (16 * 4096),
        block_bytes=16 * 4096,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_queue_size=1024,
        max_model_len=2048,
        intra_op_threads=1,
        stream_interval=0,
    )
    assert limits.num_blocks == 4096  # 256 MiB of 64 KiB blocks


def test_resolve_bytes_and_blocks() -> None:
    by_bytes = GeneratorConfig(kv_cache_bytes=10 * 65536 + 100, max_model_len=160)
    assert by_bytes.resolve(context_length=2048, kv_bytes_per_token=4096).num_blocks == 10
    by_blocks = GeneratorConfig(num_blocks=11, block_size=4, max_model_len=44)
    limits = by_blocks.resolve(context_length=2048, kv_bytes_per_token=100)
    assert (limits.num_blocks, limits.block_bytes, limits.max_model_len) == (11, 400, 44)


def test_resolve_refuses_what_cannot_work() -> None:
    with pytest.raises(ModelLoadError, match="max_model_len 4096 exceeds the model's context"):
        GeneratorConfig(max_model_len=4096).resolve(context_length=2048, kv_bytes_per_token=8)
    with pytest.raises(ModelLoadError, match=r"cannot hold one sequence of max_model_len 2048"):
        GeneratorConfig(num_blocks=100).resolve(context_length=2048, kv_bytes_per_token=8)


def test_stream_interval_auto_keeps_about_four_chunks_a_step() -> None:
    assert [stream_interval(0, n) for n in (1, 4, 5, 8, 9, 16, 17, 32, 64)] == [
        1,
        1,
        2,
        2,
        3,
        4,
        5,
        8,
        8,
    ]
    assert stream_interval(3, 1) == stream_interval(3, 64) == 3  # a set interval is kept


def test_generator_files_follow_the_model_file_symlink_rule(tmp_path: Path) -> None:
    """config.json, tokenizer.json and the optional JSON files, like the model file: a
    symlink that leads out of the model's directory needs follow_model_symlinks, and a
    FIFO is not a file."""
    store = tmp_path / "store"
    touch(store / "tokenizer.json", "{}")
    touch(store / "tokenizer_config.json", "{}")
    repo = tmp_path / "repo"
    for name in ("tokenizer", "optional", "inside", "fifo"):
        generator(repo / name)
    (repo / "tokenizer" / "tokenizer.json").unlink()
    (repo / "tokenizer" / "tokenizer.json").symlink_to(store / "tokenizer.json")
    (repo / "optional" / "tokenizer_config.json").symlink_to(store / "tokenizer_config.json")
    (repo / "inside" / "tokenizer_config.json").symlink_to("config.json")  # stays inside
    os.mkfifo(repo / "fifo" / "generation_config.json")

    def outside(name: str, file: str) -> str:
        return (
            f"{repo / name / file} leads to {str(store / file)!r}, outside the model's "
            f"directory {repo / name}; move the file in, or set follow_model_symlinks = true "
            "in the daemon's config"
        )

    errors = {src.name: src.error for src in scan_repository(repo)}
    assert errors == {
        "tokenizer": outside("tokenizer", "tokenizer.json"),
        "optional": outside("optional", "tokenizer_config.json"),
        "inside": "",
        "fifo": f"{repo / 'fifo' / 'generation_config.json'} is not a regular file",
    }
    followed = {src.name: src.error for src in scan_repository(repo, follow_symlinks=True)}
    assert followed == {**{name: "" for name in errors}, "fifo": errors["fifo"]}


def _builder_folder(directory: Path, model_file: str, genai_config: object = None) -> None:
    import json

    config = genai_config or {"model": {"decoder": {"filename": model_file}}}
    touch(directory / "genai_config.json", json.dumps(config))
    touch(directory / "tokenizer.json", "{}")
    touch(directory / model_file)


def test_builder_folders_serve_the_decoder_their_genai_config_names(tmp_path: Path) -> None:
    """Each version its own file name (a CPU and a CUDA build differ); a model.toml's
    model_file wins; a broken genai_config.json fails its version, not the scan."""
    _builder_folder(tmp_path / "phi" / "1", "phi-3-mini-cpu-int4.onnx")
    _builder_folder(tmp_path / "phi" / "2", "phi-3-mini-cuda-fp16.onnx")
    _builder_folder(tmp_path / "flat", "model-q4.onnx")
    _builder_folder(tmp_path / "pinned", "model-q4.onnx")
    touch(tmp_path / "pinned" / "model.toml", 'model_file = "other.onnx"\n')
    bad = {"model": {"decoder": {"filename": "model.onnx", "session_options": "x"}}}
    _builder_folder(tmp_path / "bad", "model.onnx", bad)
    found = scan(tmp_path)
    assert found[("phi", 1)].path == tmp_path / "phi" / "1" / "phi-3-mini-cpu-int4.onnx"
    assert found[("phi", 2)].path == tmp_path / "phi" / "2" / "phi-3-mini-cuda-fp16.onnx"
    assert found[("phi", 2)].config.model_file == "phi-3-mini-cuda-fp16.onnx"
    assert (found[("phi", 1)].kind, found[("phi", 1)].error) == ("generator", "")
    assert found[("flat", 1)].path == tmp_path / "flat" / "model-q4.onnx"
    assert found[("flat", 1)].kind == "generator"
    assert "holding other.onnx" in found[("pinned", 1)].error
    assert found[("bad", 1)].kind == "generator" and found[("bad", 1)].error == ""
