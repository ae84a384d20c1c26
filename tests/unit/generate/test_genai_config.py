"""genai_config.json read as a model-builder folder's decoder: real shapes, and refusals
that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensord.errors import ModelLoadError
from tensord.generate.model.genai_config import builder_model_file, read_genai_config

PHI3 = {  # the shape Microsoft's Phi-3-mini-4k-instruct-onnx CPU folder writes
    "model": {
        "bos_token_id": 1,
        "context_length": 4096,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "phi3-mini-4k-instruct-cpu-int4-rtn-block-32-acc-level-4.onnx",
            "head_size": 96,
            "hidden_size": 3072,
            "inputs": {
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "past_key_names": "past_key_values.%d.key",
                "past_value_names": "past_key_values.%d.value",
            },
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value",
            },
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
        },
        "eos_token_id": [32007, 32001, 32000],
        "pad_token_id": 32000,
        "type": "phi3",
        "vocab_size": 32064,
    },
    "search": {"do_sample": False, "max_length": 4096, "top_k": 1, "top_p": 1.0},
}


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(data))
    return path


def test_a_published_folder_reads_as_config_json_would(tmp_path: Path) -> None:
    genai = read_genai_config(_write(tmp_path, PHI3))
    assert genai.filename.startswith("phi3-mini-4k-instruct-cpu-int4")
    assert genai.config.str_or_empty("model_type") == "phi3"
    assert genai.providers == () and genai.sliding_window is None
    config = genai.config
    assert config.require_int(("num_attention_heads",)) == 32
    assert config.require_int(("max_position_embeddings",)) == 4096
    assert config.token_ids("eos_token_id", 32064) == (32007, 32001, 32000)
    assert genai.search.bool_or_none("do_sample") is False


def test_a_cuda_build_names_its_provider_and_windows_come_through(tmp_path: Path) -> None:
    data = json.loads(json.dumps(PHI3))
    decoder = data["model"]["decoder"]
    decoder["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "0"}}]
    decoder["sliding_window"] = {"window_size": 4096, "layers": [0, 2], "cache_slack": 0}
    genai = read_genai_config(_write(tmp_path, data))
    assert genai.providers == ("cuda",)
    assert genai.sliding_window is not None
    assert (genai.sliding_window.window_size, genai.sliding_window.layers) == (4096, (0, 2))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["model"]["decoder"]["inputs"].update(input_ids="tokens"),
         "model.decoder.inputs.input_ids is 'tokens'; tensord serves the model builder's names"),
        (lambda d: d["model"]["decoder"].update(session_options="x"),
         "model.decoder.session_options must be a JSON object"),
        (lambda d: d["model"]["decoder"]["session_options"].update(provider_options="cuda"),
         "provider_options must be a list"),
        (lambda d: d["model"]["decoder"].pop("num_attention_heads"),
         "num_attention_heads is missing"),
        (lambda d: d["model"]["decoder"].update(filename="../model.onnx"),
         "model.decoder.filename must be a file name"),
        (lambda d: d.update(model=[]), "model must be a JSON object"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_naming_the_field(
    tmp_path: Path, change: Any, message: str
) -> None:
    data = json.loads(json.dumps(PHI3))
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_genai_config(path)


def test_the_scan_reads_the_decoder_file_name_and_never_fails(tmp_path: Path) -> None:
    _write(tmp_path, PHI3)
    assert builder_model_file(tmp_path) == PHI3["model"]["decoder"]["filename"]  # type: ignore[index]
    for garbage in ("[1, 2]", "{", '{"model": {"decoder": {"filename": "../x.onnx"}}}'):
        (tmp_path / "genai_config.json").write_text(garbage)
        assert builder_model_file(tmp_path) is None
    (tmp_path / "genai_config.json").unlink()
    assert builder_model_file(tmp_path) is None
