"""The position_ids rewrite of graphs that count positions from their past's length: found,
applied only to the rotary embedding, checked on the model, and dropped when the check
disagrees (real Optimum exports, real ONNX Runtime sessions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from tensord.generate.model.batch_layout import BatchLayout
from tensord.generate.model.graph_rewrite import ROTARY_SCOPE, add_position_ids
from tensord.generate.model.model_dir import read_generator_spec
from tensord.generate.model.serving_graph import REWRITTEN_REASON, open_serving_graph
from tensord.modelconfig.model import ModelConfig
from tests.hf_families import ExportCache


def _graph(directory: Path) -> onnx.ModelProto:
    return onnx.load(str(directory / "model.onnx"), load_external_data=False)


def test_gemma_gets_position_ids_for_its_rotary_embedding_only(hf_exports: ExportCache) -> None:
    original = _graph(hf_exports.get("gemma"))
    rewritten = add_position_ids(original)
    assert rewritten is not None
    (position_ids,) = [v for v in rewritten.graph.input if v.name == "position_ids"]
    dims = [d.dim_param for d in position_ids.type.tensor_type.shape.dim]
    assert dims == ["batch_size", "sequence_length"]
    users = [n for n in rewritten.graph.node if "position_ids" in n.input]
    assert users and all(ROTARY_SCOPE in n.name for n in users)
    # The mask still reads the traced positions (key indices), and the original is intact.
    traced = [n.output[0] for n in original.graph.node if n.name == "/model/Unsqueeze"]
    assert any(traced[0] in n.input for n in rewritten.graph.node)
    assert "position_ids" not in {v.name for v in original.graph.input}


def test_graphs_with_position_ids_or_without_the_pattern_are_left_alone(
    hf_exports: ExportCache,
) -> None:
    assert add_position_ids(_graph(hf_exports.get("llama"))) is None
    bloom = _graph(hf_exports.get("bloom"))  # ALiBi: no rotary embedding at all
    assert add_position_ids(bloom) is None


def test_gemma_serves_padded_through_the_rewrite(hf_exports: ExportCache) -> None:
    spec = read_generator_spec(hf_exports.get("gemma"))
    serving = open_serving_graph(spec, ModelConfig())
    try:
        assert serving.position_ids and serving.layout.layout is BatchLayout.PADDED
        assert serving.layout.reason.startswith(REWRITTEN_REASON)
        assert "position_ids" in [s.name for s in serving.backend.inputs]
    finally:
        serving.backend.close()


def test_a_rewrite_the_check_rejects_falls_back_to_equal_lengths(
    hf_exports: ExportCache, tmp_path: Path
) -> None:
    """Scope the mask's use of the traced positions as rotary too: the rewrite then feeds
    real positions to the causal mask, which a right-aligned batch gets wrong, and the
    check sees it; the export as it is serves instead, one past length per pass."""
    directory = shutil.copytree(hf_exports.get("gemma"), tmp_path / "gemma")
    model = onnx.load(str(directory / "model.onnx"))
    (traced,) = [n.output[0] for n in model.graph.node if n.name == "/model/Unsqueeze"]
    for node in model.graph.node:
        if traced in node.input and ROTARY_SCOPE not in node.name:
            node.name = f"/model/{ROTARY_SCOPE}/moved/{node.name}"
    onnx.save(model, str(directory / "model.onnx"))
    serving = open_serving_graph(read_generator_spec(directory), ModelConfig())
    try:
        assert not serving.position_ids
        assert serving.layout.layout is BatchLayout.EQUAL_LENGTH
        assert "counts positions from the past's length" in serving.layout.reason
    finally:
        serving.backend.close()


def test_model_toml_may_ask_for_equal_lengths(hf_exports: ExportCache) -> None:
    spec = read_generator_spec(hf_exports.get("gemma"))
    serving = open_serving_graph(spec, ModelConfig(), configured=BatchLayout.EQUAL_LENGTH)
    try:
        assert (serving.position_ids, serving.layout.layout) == (False, BatchLayout.EQUAL_LENGTH)
    finally:
        serving.backend.close()


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "gpt_oss", "nemotron"])
def test_the_other_families_are_rewritten(hf_exports: ExportCache, family: str) -> None:
    assert add_position_ids(_graph(hf_exports.get(family))) is not None
