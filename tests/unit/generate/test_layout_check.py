"""The batch layout: chosen from the graph, restricted by model.toml, and checked on the model
at load (real ONNX Runtime sessions on the demo decoder, edited to break each layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.demo.decoder_graph import DecoderShape
from tensord.demo.generator import DemoGeneratorOptions, build_demo_generator
from tensord.errors import ModelLoadError
from tensord.generate.model.batch_layout import BatchLayout, LayoutChoice, choose_layout, restrict
from tensord.generate.model.layout_check import check_layout
from tensord.generate.model.model_dir import read_generator_spec
from tensord.generate.worker.kv_storage import HostKVStorage, KVShape
from tensord.generate.worker.model_runner import ModelRunner
from tensord.modelconfig.model import ModelConfig
from tests.hf_families import ExportCache

# Exporting traces PyTorch code: its tracer and deprecation warnings are not about tensord.
pytestmark = pytest.mark.filterwarnings("ignore")

SMALL = DemoGeneratorOptions(DecoderShape(num_layers=1, hidden_size=64, intermediate_size=128))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_generator(tmp_path_factory.mktemp("layout") / "tiny", SMALL)


def _runner(directory: Path, layout: BatchLayout, num_blocks: int = 32) -> ModelRunner:
    spec = read_generator_spec(directory)
    backend = OnnxRuntimeBackend(spec.model_path, ModelConfig())
    shape = KVShape(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy)
    storage = HostKVStorage(shape, num_blocks=num_blocks, block_size=4)
    return ModelRunner(backend.run, storage, spec.num_layers, spec.has_position_ids, layout=layout)


def _edited(directory: Path, out: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the generator directory whose graph `edit` changed."""
    out.mkdir()
    for item in directory.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    model = onnx.load(str(out / "model.onnx"))
    edit(model.graph)
    onnx.save(model, str(out / "model.onnx"))
    return out


def _rename_output(graph: onnx.GraphProto, name: str) -> str:
    """Make the node producing graph output `name` write `name`_raw instead."""
    for node in graph.node:
        for i, output in enumerate(node.output):
            if output == name:
                node.output[i] = f"{name}_raw"
    return f"{name}_raw"


def _rows_interfere(graph: onnx.GraphProto) -> None:
    """logits += 0.5 * (mean of logits over the batch): a row depends on its neighbours."""
    raw = _rename_output(graph, "logits")
    graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    graph.node.extend(
        [
            helper.make_node("ReduceMean", [raw], ["batch_mean"], axes=[0], keepdims=1),
            helper.make_node("Mul", ["batch_mean", "half"], ["batch_mix"]),
            helper.make_node("Add", [raw, "batch_mix"], ["logits"]),
        ]
    )


def _cache_drifts(graph: onnx.GraphProto) -> None:
    """present.0.key = 0.5 * (past + new keys): what the cache holds is not what a full pass
    computes, so decoding from it disagrees with a pass over the whole sequence."""
    raw = _rename_output(graph, "present.0.key")
    graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "drift"))
    graph.node.append(helper.make_node("Mul", [raw, "drift"], ["present.0.key"]))


def test_choices_from_the_graph() -> None:
    assert choose_layout("llama", True).layout is BatchLayout.PADDED
    assert choose_layout("bloom", False).layout is BatchLayout.PADDED
    gemma = choose_layout("gemma", False)
    assert gemma.layout is BatchLayout.EQUAL_LENGTH
    assert "counts positions from the past's length" in gemma.reason
    assert choose_layout("something_new", False).layout is BatchLayout.EQUAL_LENGTH


def test_model_toml_may_only_narrow_the_layout() -> None:
    padded, equal = choose_layout("llama", True), choose_layout("gemma", False)
    assert restrict(padded, None) is padded
    assert restrict(padded, BatchLayout.SINGLE) == LayoutChoice(
        BatchLayout.SINGLE, "set by [generator] batch_layout in model.toml"
    )
    assert restrict(equal, BatchLayout.EQUAL_LENGTH) is equal
    with pytest.raises(ValueError, match="batch_layout 'padded' cannot serve this model correctly"):
        restrict(equal, BatchLayout.PADDED)


def test_a_sound_graph_keeps_the_padded_layout(tiny: Path) -> None:
    runner = _runner(tiny, BatchLayout.PADDED)
    choice = check_layout(runner, choose_layout("llama", True), 2048, half=False)
    assert choice.layout is BatchLayout.PADDED and runner.layout is BatchLayout.PADDED
    assert "(checked at load: as alone within " in choice.reason
    assert runner.stats.max_sequences == 2  # the checks really shared passes


def test_rows_that_interfere_run_one_per_pass(tiny: Path, tmp_path: Path) -> None:
    broken = _edited(tiny, tmp_path / "mixed", _rows_interfere)
    runner = _runner(broken, BatchLayout.PADDED)
    choice = check_layout(runner, choose_layout("llama", True), 2048, half=False)
    assert choice.layout is BatchLayout.SINGLE and runner.layout is BatchLayout.SINGLE
    assert choice.reason.startswith("a sequence beside another of the same length gave logits ")
    assert choice.reason.endswith(
        "of their scale away from the sequence alone: one sequence per pass"
    )


def test_a_cache_that_disagrees_with_a_full_pass_is_refused(tiny: Path, tmp_path: Path) -> None:
    broken = _edited(tiny, tmp_path / "drift", _cache_drifts)
    with pytest.raises(ModelLoadError, match="KV-cache decoding disagrees with a full pass"):
        check_layout(_runner(broken, BatchLayout.PADDED), choose_layout("llama", True), 2048, False)


def test_a_pool_too_small_for_the_check_keeps_the_choice(tiny: Path) -> None:
    runner = _runner(tiny, BatchLayout.PADDED, num_blocks=6)
    choice = choose_layout("llama", True)
    assert check_layout(runner, choice, 2048, half=False) is choice
    assert runner.stats.passes == 0


def test_gemma_is_moved_off_padded_by_the_check(hf_exports: ExportCache) -> None:
    """Gemma's export counts positions from the past's length: forced onto the padded
    layout, the check measures the shift and falls back to equal lengths."""
    directory = hf_exports.get("gemma")
    runner = _runner(directory, BatchLayout.PADDED)
    forced = LayoutChoice(BatchLayout.PADDED, "forced")
    choice = check_layout(runner, forced, read_generator_spec(directory).vocab_size, False)
    assert choice.layout is BatchLayout.EQUAL_LENGTH
    off = float(choice.reason.split("gave logits ")[1].split()[0])
    assert off > 0.1, choice.reason
