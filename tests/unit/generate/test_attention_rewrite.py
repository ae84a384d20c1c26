"""An Optimum export's attention rewritten onto GroupQueryAttention: what is found, what
the node says, what is declined, and that the check against the export's own logits
catches a rewrite that changed the model (real exports, real ONNX Runtime sessions)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx
import pytest
from onnx import helper

from tensord.errors import ModelLoadError
from tensord.generate.model.attention_rewrite import (
    RewriteDeclined,
    layer_windows,
    rewrite_attention,
    rewrite_export,
)
from tensord.generate.model.model_dir import read_generator_spec
from tensord.generate.model.slot_graph import (
    check_against_export,
    check_sequences,
    export_logits,
    open_slot_session,
    slot_runner,
)
from tensord.modelconfig.model import ModelConfig
from tests.hf_families import ExportCache


def _gqa(model: onnx.ModelProto) -> list[dict[str, object]]:
    """Each GroupQueryAttention node's attributes, in layer order."""
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    return [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in nodes]


def test_each_layer_becomes_one_node_with_the_exports_scale(hf_exports: ExportCache) -> None:
    directory = hf_exports.get("llama")
    spec = read_generator_spec(directory)
    rewritten = onnx.load_from_string(rewrite_export(spec))
    attributes = _gqa(rewritten)
    assert len(attributes) == spec.num_layers == 2
    for attrs in attributes:
        assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == (4, 2, 0)
        assert math.isclose(float(attrs["scale"]), 1 / math.sqrt(spec.head_dim), rel_tol=1e-6)  # type: ignore[arg-type]
        assert "softcap" not in attrs and "local_window_size" not in attrs
    assert "Softmax" not in {n.op_type for n in rewritten.graph.node}  # attention is gone
    writers = {
        n.op_type for n in rewritten.graph.node for o in n.output if o.startswith("present.")
    }
    assert writers == {"GroupQueryAttention"}


def test_sliding_windows_and_scale_come_from_the_export(hf_exports: ExportCache) -> None:
    """gemma2: a window of 8 on alternate layers; queries scaled by
    query_pre_attn_scalar ** -0.5; no softcap, as the export (sdpa attention) has none."""
    directory = hf_exports.get("gemma2")
    spec = read_generator_spec(directory)
    config = json.loads((directory / "config.json").read_text())
    windows = layer_windows(config, spec.num_layers)
    assert windows == (8, None)
    attributes = _gqa(onnx.load_from_string(rewrite_export(spec)))
    assert [a.get("local_window_size") for a in attributes] == [8, None]
    assert not any("softcap" in a for a in attributes)
    scale = config["query_pre_attn_scalar"] ** -0.5
    assert all(a["scale"] == pytest.approx(scale, rel=1e-5) for a in attributes)


def test_scores_capped_by_tanh_become_the_kernels_softcap(
    hf_exports: ExportCache, tmp_path: Path
) -> None:
    """The llama export with Gemma 2's eager softcap put into its scores (x / c, tanh,
    x c, with c small enough to matter): the rewrite gives the kernel that softcap, and
    its slots match the changed export's own logits."""
    import shutil

    directory = Path(shutil.copytree(hf_exports.get("llama"), tmp_path / "capped"))
    model = onnx.load(str(directory / "model.onnx"))
    graph = model.graph
    graph.initializer.append(helper.make_tensor("cap", onnx.TensorProto.FLOAT, [], [0.5]))
    for layer in range(2):
        (scores,) = [n for n in graph.node if n.name == f"/model/layers.{layer}/self_attn/MatMul"]
        out = scores.output[0]
        (user,) = [n for n in graph.node if out in n.input and n.op_type == "Add"]
        names = [f"capped_{layer}_{i}" for i in range(3)]
        graph.node.extend(
            [
                helper.make_node("Div", [out, "cap"], [names[0]]),
                helper.make_node("Tanh", [names[0]], [names[1]]),
                helper.make_node("Mul", [names[1], "cap"], [names[2]]),
            ]
        )
        user.input[list(user.input).index(out)] = names[2]
    sorted_nodes = onnx.helper.make_graph(
        list(graph.node), graph.name, graph.input, graph.output, graph.initializer
    )
    del graph.node[:]
    graph.node.extend(_topological(sorted_nodes.node))
    onnx.save(model, str(directory / "model.onnx"))
    spec = read_generator_spec(directory)
    rewritten = rewrite_export(spec)
    assert [a["softcap"] for a in _gqa(onnx.load_from_string(rewritten))] == [0.5, 0.5]
    sequences = check_sequences(spec, 64)
    logits = export_logits(spec, ModelConfig(), None, sequences)
    session = open_slot_session(spec, ModelConfig(), None, rewritten)
    try:
        runner = slot_runner(session, spec, 64, 2, position_ids=True)
        check_against_export(runner, spec, list(zip(sequences, logits, strict=True)))
    finally:
        session.backend.close()


def _topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    produced = {o: n for n in nodes for o in n.output}
    placed: list[onnx.NodeProto] = []
    seen: set[int] = set()

    def place(node: onnx.NodeProto) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for name in node.input:
            if name in produced:
                place(produced[name])
        placed.append(node)

    for node in nodes:
        place(node)
    return placed


@pytest.mark.parametrize(
    ("config", "windows"),
    [
        ({"sliding_window": 16}, (16, 16)),
        ({"sliding_window": 16, "use_sliding_window": False}, (None, None)),
        (
            {"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]},
            (None, 8),
        ),
        ({"sliding_window": None}, (None, None)),
        ({}, (None, None)),
    ],
)
def test_layer_windows_read_as_transformers_reads_them(
    config: dict[str, object], windows: tuple[int | None, ...]
) -> None:
    assert layer_windows(config, 2) == windows


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("bloom", "bloom attention adds ALiBi position biases"),
        ("gpt2", "the keys of present.0.key pass a Mul"),
        ("gpt_oss", "pass a Concat"),  # attention sinks joined to the scores
    ],
)
def test_what_it_cannot_express_is_declined(
    hf_exports: ExportCache, family: str, reason: str
) -> None:
    spec = read_generator_spec(hf_exports.get(family))
    with pytest.raises(RewriteDeclined, match=reason):
        rewrite_export(spec)


def test_a_rewrite_that_changes_the_model_is_caught(
    hf_exports: ExportCache, tmp_path: Path
) -> None:
    """The same rewrite with a wrong scale: the slots decode consistently, but the check
    against the export's own logits refuses it."""
    spec = read_generator_spec(hf_exports.get("llama"))
    model = onnx.load_from_string(rewrite_export(spec))
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            for attr in node.attribute:
                if attr.name == "scale":
                    attr.f *= 1.5
    sequences = check_sequences(spec, 64)
    logits = export_logits(spec, ModelConfig(), None, sequences)
    session = open_slot_session(spec, ModelConfig(), None, model.SerializeToString())
    try:
        runner = slot_runner(session, spec, 64, 2, position_ids=True)
        with pytest.raises(ModelLoadError, match="away from the export's own"):
            check_against_export(runner, spec, list(zip(sequences, logits, strict=True)))
        # The unchanged rewrite passes the same check.
        good = open_slot_session(spec, ModelConfig(), None, rewrite_export(spec))
        try:
            runner = slot_runner(good, spec, 64, 2, position_ids=True)
            check_against_export(runner, spec, list(zip(sequences, logits, strict=True)))
        finally:
            good.backend.close()
    finally:
        session.backend.close()


def test_a_graph_without_the_pattern_is_declined_not_served(tmp_path: Path) -> None:
    """The demo decoder masks its scores by selection with the mask second: declined."""
    from tensord.demo.repository import build_demo_repository

    build_demo_repository(tmp_path)
    spec = read_generator_spec(tmp_path / "tinylm")
    with pytest.raises(RewriteDeclined, match=r"the scores \S+ pass a Where"):
        rewrite_attention(
            onnx.load(str(spec.model_path)),
            num_layers=spec.num_layers,
            num_heads=spec.num_attention_heads,
            num_kv_heads=spec.num_kv_heads,
        )


@pytest.mark.parametrize(
    "config",
    [
        {"sliding_window": 4096, "max_window_layers": 28, "use_sliding_window": True},
        {"sliding_window": 4096, "model_type": "gemma2"},
        {"sliding_window": 1024, "sliding_window_pattern": 6},
    ],
)
def test_windows_on_some_layers_by_a_familys_rule_are_declined(config: dict[str, object]) -> None:
    with pytest.raises(RewriteDeclined, match="not on every layer"):
        layer_windows(config, 2)


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_a_bias_added_to_the_scores_is_declined_from_the_graph(
    hf_exports: ExportCache, family: str
) -> None:
    """ALiBi slopes reach the scores as an Add computed from weights: declined by the
    graph itself, not only by the family's name."""
    spec = read_generator_spec(hf_exports.get(family))
    with pytest.raises(RewriteDeclined, match="more than a mask"):
        rewrite_attention(
            onnx.load(str(spec.model_path)),
            num_layers=spec.num_layers,
            num_heads=spec.num_attention_heads,
            num_kv_heads=spec.num_kv_heads,
        )


@pytest.mark.parametrize(("window", "longest"), [(100, 108), (4096, 40), (None, 40)])
def test_the_load_check_reaches_past_a_short_window(
    hf_exports: ExportCache, tmp_path: Path, window: int | None, longest: int
) -> None:
    """Its sequences pass every window up to CHECKED_WINDOW, so the kernel's window is
    compared with the export's own; a longer one is not reached (40 tokens)."""
    import shutil

    directory = Path(shutil.copytree(hf_exports.get("mistral_sw16"), tmp_path / "m"))
    config = json.loads((directory / "config.json").read_text())
    config["sliding_window"] = window
    (directory / "config.json").write_text(json.dumps(config))
    spec = read_generator_spec(directory)
    assert len(check_sequences(spec, 512)[0]) == longest
    assert len(check_sequences(spec, 64)[0]) == min(longest, 63)
