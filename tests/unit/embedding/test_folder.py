"""Reading sentence-transformers folders: what is served, how it is detected, and every
layout that cannot be served exactly refused with its reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tensord.backends.onnx_file import graph_output_names
from tensord.embedding.folder import embedding_model_file, read_embedding_folder
from tensord.errors import ModelLoadError
from tensord.modelconfig.embedding import EmbeddingConfig
from tensord.registry.repository import read_repository
from tests.tools import require_module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    for module in ("torch", "transformers", "optimum.exporters.onnx", "sentence_transformers"):
        require_module(module, "make setup (the export extra)")
    from tests.st_models import build_st_folder

    root = tmp_path_factory.mktemp("st")
    return {
        "hub": build_st_folder(root, "bert", "hub"),
        "optimum": build_st_folder(root, "mpnet", "optimum", pooling="cls"),
    }


@pytest.fixture
def hub(built: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the Hub-layout folder to change."""
    return Path(shutil.copytree(built["hub"], tmp_path / "hub"))


def test_the_hub_layout(built: dict[str, Path]) -> None:
    folder = built["hub"]
    assert embedding_model_file(folder) == "onnx/model.onnx"
    spec = read_embedding_folder(folder, "onnx/model.onnx")
    assert (spec.pooling, spec.normalize, spec.output) == (("mean",), True, "last_hidden_state")
    assert spec.inputs == ("input_ids", "attention_mask", "token_type_ids")
    assert (spec.max_seq_length, spec.dimensions, spec.pad_token_id) == (64, 64, 0)


def test_the_optimum_layout_is_found_by_its_graph(built: dict[str, Path]) -> None:
    folder = built["optimum"]
    assert not (folder / "modules.json").exists()
    assert embedding_model_file(folder) == "model.onnx"
    assert graph_output_names(folder / "model.onnx") == ["token_embeddings", "sentence_embedding"]
    spec = read_embedding_folder(folder, "model.onnx")
    assert (spec.output, spec.pooling, spec.pad_token_id) == ("sentence_embedding", (), 1)
    assert spec.max_seq_length == 64  # tokenizer_config.json's model_max_length
    assert spec.inputs == ("input_ids", "attention_mask")


def test_a_scan_serves_the_folder_as_it_is(built: dict[str, Path], tmp_path: Path) -> None:
    for name in ("hub", "optimum"):
        shutil.copytree(built[name], tmp_path / name)
    scan = read_repository(tmp_path)
    kinds = {(s.name, s.kind, s.path.relative_to(tmp_path).as_posix()) for s in scan.sources}
    assert kinds == {
        ("hub", "embedding", "hub/onnx/model.onnx"),
        ("optimum", "embedding", "optimum/model.onnx"),
    }
    assert all(not s.error for s in scan.sources)
    assert [s for s in scan.skipped if s.notable] == []  # 1_Pooling/ is the folder's own


def test_model_toml_overrides_and_refusals(hub: Path) -> None:
    spec = read_embedding_folder(hub, "onnx/model.onnx", EmbeddingConfig(pooling="cls"))
    assert spec.pooling == ("cls",)
    (hub / "model.toml").write_text("max_batch_size = 4\n")
    (source,) = read_repository(hub.parent).sources
    assert "max_batch_size is not used by an embedding model" in source.error


def test_a_module_after_pooling_needs_the_whole_pipeline(hub: Path) -> None:
    modules = json.loads((hub / "modules.json").read_text())
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (hub / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match=r"runs \['Dense'\] after pooling"):
        read_embedding_folder(hub, "onnx/model.onnx")


def test_refusals_name_the_file_and_field(hub: Path) -> None:
    pooling = hub / "1_Pooling" / "config.json"
    flags = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({k: False if k.startswith("pooling_mode") else v
                                   for k, v in flags.items()}))  # fmt: skip
    with pytest.raises(ModelLoadError, match="no pooling_mode_\\* flag is true"):
        read_embedding_folder(hub, "onnx/model.onnx")
    pooling.write_text(json.dumps(flags))
    (hub / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 4096}))
    with pytest.raises(ModelLoadError, match="max_seq_length 4096 exceeds the 512 positions"):
        read_embedding_folder(hub, "onnx/model.onnx")


def test_the_default_prompt_goes_before_every_text(hub: Path) -> None:
    (hub / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"})
    )
    assert read_embedding_folder(hub, "onnx/model.onnx").prompt == "query: "


def test_graph_outputs_of_a_file_that_is_no_model(tmp_path: Path) -> None:
    junk = tmp_path / "model.onnx"
    junk.write_bytes(b"\xff" * 100)
    assert graph_output_names(junk) == []


def test_module_paths_stay_in_the_folder(hub: Path) -> None:
    modules = json.loads((hub / "modules.json").read_text())
    modules[1]["path"] = "../elsewhere"
    (hub / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="leads outside the folder"):
        read_embedding_folder(hub, "onnx/model.onnx")


def test_a_malformed_length_in_a_graph_reads_as_no_outputs(tmp_path: Path) -> None:
    huge = tmp_path / "model.onnx"
    # ModelProto.graph (field 7) of 2**62 bytes, in a file of a few bytes
    huge.write_bytes(bytes([7 << 3 | 2]) + bytes([0xFF] * 8) + bytes([0x3F]) + b"x" * 16)
    assert graph_output_names(huge) == []
    inner = tmp_path / "inner.onnx"
    # a graph of 12 bytes whose output field (12) claims 2**40 bytes
    body = bytes([12 << 3 | 2]) + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x20]) + b"abcde"
    inner.write_bytes(bytes([7 << 3 | 2, len(body)]) + body)
    assert graph_output_names(inner) == []


def test_llama_class_tokenizers_get_transformers_special_tokens(tmp_path: Path) -> None:
    """A Llama-class tokenizer's BOS and EOS come from tokenizer_config.json, as
    transformers rebuilds its post-processor at load (add_eos_token, for lasttoken)."""
    transformers = require_module("transformers", "make setup (the export extra)")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tensord.embedding.tokenizer import embedding_tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": True,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
    }))  # fmt: skip
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = embedding_tokenizer(tmp_path / "tokenizer.json", 16)
    assert ours.encode("hello world").ids == reference("hello world")["input_ids"] == [1, 3, 4, 2]


def test_check_config_describes_the_folder(built: dict[str, Path], tmp_path: Path) -> None:
    from tensord.repository_check import check_repository

    shutil.copytree(built["hub"], tmp_path / "minilm")
    (model,) = check_repository(tmp_path).models
    (version,) = model.versions
    assert (model.kind, version.problem) == ("embedding", "")
    assert [(t.name, t.dtype) for t in version.inputs] == [("text", "string")]
    assert [(t.name, t.dtype) for t in version.outputs] == [("embedding", "float32")]
    assert "mean pooling" in version.notes[0]


def test_a_folder_file_outside_the_folder_is_refused(hub: Path, tmp_path: Path) -> None:
    """A file the folder reads that symlinks lead outside the model's directory fails the
    model with the path it leads to, and nothing of its text."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"default_prompt_name": "hunter2"}')
    (hub / "config_sentence_transformers.json").unlink(missing_ok=True)
    (hub / "config_sentence_transformers.json").symlink_to(secret)
    (source,) = read_repository(hub.parent).sources
    assert "secret.json" in source.error and "outside the model's directory" in source.error
    assert "hunter2" not in source.error
