"""Give a decoder that counts positions from its past a position_ids input, for batching.

Optimum exports Gemma (1-3), GPT-OSS and Nemotron without position_ids: the traced graph
computes `cache_position = Range(past_length, past_length + T)` and
`position_ids = Unsqueeze(cache_position, 0)`, and feeds that to its rotary embedding (and
to its masks, where it is the query's key index). With a padded batch, a shorter
sequence's past length is the batch's width, not its own, so its rotary positions shift.

This adds a graph input `position_ids` [batch, sequence] and points only the rotary
embedding's uses of the traced position_ids at it (nodes in a `rotary_emb` module scope,
as transformers names the module and torch.onnx names its nodes). The masks keep the
key-index arithmetic, which right-aligned pasts keep exact. The rewrite touches the graph
only, never the weights (external data stays where it is). Whether the result is right is
not assumed: the loader checks it on the model (layout_check.py) and falls back to the
graph as exported, one past length per pass, when the check disagrees.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from tensord.generate.model.graph_io import INPUT_IDS, POSITION_IDS

ROTARY_SCOPE = "rotary_emb"
"""Part of every node name inside transformers' rotary embedding modules (rotary_emb,
rotary_emb_local) as torch.onnx scopes them."""


def _constant_value(graph: onnx.GraphProto, name: str) -> list[int] | None:
    """An int tensor's values when `name` is an initializer or a Constant node's output."""
    for init in graph.initializer:
        if init.name == name:
            return [int(v) for v in numpy_helper.to_array(init).reshape(-1)]
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return [int(v) for v in numpy_helper.to_array(attr.t).reshape(-1)]
    return None


def _traced_position_ids(graph: onnx.GraphProto) -> list[str]:
    """Outputs of Unsqueeze(Range(...), axes=[0]): the graph's own position_ids."""
    ranges = {node.output[0] for node in graph.node if node.op_type == "Range"}
    found = []
    for node in graph.node:
        if node.op_type != "Unsqueeze" or node.input[0] not in ranges:
            continue
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
        if axes is None and len(node.input) > 1:
            axes = _constant_value(graph, node.input[1])
        if axes == [0]:
            found.append(node.output[0])
    return found


def add_position_ids(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` whose rotary embedding reads a new position_ids input; None when
    the graph already takes position_ids or the traced pattern is not there."""
    graph = model.graph
    names = {value.name for value in graph.input}
    if POSITION_IDS in names or INPUT_IDS not in names:
        return None
    traced = set(_traced_position_ids(graph))
    if not traced:
        return None
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    count = 0
    for node in rewritten.graph.node:
        if ROTARY_SCOPE not in node.name:
            continue
        for i, name in enumerate(node.input):
            if name in traced:
                node.input[i] = POSITION_IDS
                count += 1
    if count == 0:
        return None
    (input_ids,) = [v for v in rewritten.graph.input if v.name == INPUT_IDS]
    dims = [d.dim_param or (d.dim_value or None) for d in input_ids.type.tensor_type.shape.dim]
    rewritten.graph.input.append(
        helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, dims)
    )
    return rewritten
