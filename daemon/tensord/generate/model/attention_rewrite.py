"""Rewrite an Optimum export's attention onto GroupQueryAttention, for the KV-slot path.

An Optimum (torch.onnx) decoder computes each layer's attention from traced operators:
the new keys and values are concatenated after the past (`present.i.key = Concat(past,
K)`), repeated over the query heads, and the scores are MatMul, scale, mask, Softmax,
MatMul. ONNX Runtime's GroupQueryAttention does all of that in one kernel over a KV
buffer that is past and present at once, so each sequence's cache can stay in its slot.

The rewrite anchors on what every export has, whatever the family: the two Concats that
make a layer's present key and value (their second inputs are the new keys and values,
after the export's own rotary, normalisation or none), the MatMul the repeated keys reach
(its other input is the query, after its rotary), the Softmax after it and the MatMul
with the values, then the Transpose and Reshape to [batch, tokens, heads x head size].
Constant factors met on the way (the scale, split over query and keys or applied to the
scores) multiply into GroupQueryAttention's `scale`; `x / c -> Tanh -> x c` becomes its
`softcap`; masks added to the scores are dropped (the kernel is causal, bounded per row
by seqlens_k and, for a sliding-window layer, by `local_window_size`). Rotary stays the
export's (`do_rotary` 0): its position_ids input gives each row its own positions.

Anything else between those anchors, or a layer the walk cannot follow, and the rewrite
declines (returns why); the loader checks a rewritten graph numerically before it serves
with it, as for every slot graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto, helper, numpy_helper

from tensord.generate.model.graph_rewrite import add_position_ids
from tensord.generate.model.model_dir import GeneratorSpec

_PASS_THROUGH = frozenset({"Unsqueeze", "Expand", "Reshape", "Transpose", "Cast", "Squeeze"})
"""Ops the repeated keys pass through on their way to the scores (repeat_kv, K^T)."""
_SEQLENS = "tensord_seqlens_k"
_TOTAL = "tensord_total_sequence_length"


class RewriteDeclined(ValueError):
    """The graph's attention is not one the rewrite can express; the message says why."""


@dataclass(slots=True)
class Attention:
    """One layer's attention, as found in the export."""

    layer: int
    query: str
    """[batch, heads, tokens, head size], after the export's rotary."""
    key: str
    value: str
    """[batch, kv heads, tokens, head size]: the new keys (after rotary) and values."""
    output: str
    """[batch, tokens, heads x head size]: what the layer's output projection reads."""
    scale: float
    softcap: float
    nodes: list[onnx.NodeProto]
    """The nodes the GroupQueryAttention node replaces."""


class _Graph:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {i.name: i for i in graph.initializer}

    def constant(self, name: str) -> float | None:
        """A scalar constant's value (an initializer or a Constant node's), else None."""
        init = self.initializers.get(name)
        if init is not None:
            values = numpy_helper.to_array(init).reshape(-1)
            return float(values[0]) if values.size == 1 else None
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values = numpy_helper.to_array(attr.t).reshape(-1)
                    return float(values[0]) if values.size == 1 else None
        return None

    def data_consumers(self, name: str) -> list[onnx.NodeProto]:
        """Consumers that read `name` as data (not only its shape)."""
        return [n for n in self.consumers.get(name, []) if n.op_type != "Shape"]


def _factor(g: _Graph, node: onnx.NodeProto, data: str) -> float | None:
    """A Mul or Div of `data` by a scalar constant: the factor it applies; else None."""
    other = [i for i in node.input if i != data]
    if node.op_type not in ("Mul", "Div") or len(other) != 1:
        return None
    value = g.constant(other[0])
    if value is None or (node.op_type == "Div" and node.input[0] != data):
        return None
    return value if node.op_type == "Mul" else 1.0 / value


def _only_consumer(g: _Graph, name: str, what: str) -> onnx.NodeProto:
    """The one node that reads `name` as data; RewriteDeclined naming `what` otherwise."""
    nodes = g.data_consumers(name)
    if len(nodes) != 1:
        raise RewriteDeclined(f"{what} reach {len(nodes)} data consumers")
    return nodes[0]


def _follow_keys(g: _Graph, present: str) -> tuple[onnx.NodeProto, float, list[onnx.NodeProto]]:
    """From a layer's present keys to the scores MatMul (keys as its second input): the
    MatMul, the constant factor applied on the way, and the nodes passed."""
    name, factor = present, 1.0
    passed: list[onnx.NodeProto] = []
    for _ in range(16):
        node = _only_consumer(g, name, f"the keys of {present}")
        if node.op_type == "MatMul" and node.input[1] == name:
            return node, factor, passed
        scale = _factor(g, node, name)
        if scale is not None:
            factor *= scale
        elif node.op_type not in _PASS_THROUGH or node.input[0] != name:
            raise RewriteDeclined(f"the keys of {present} pass a {node.op_type}")
        passed.append(node)
        name = node.output[0]
    raise RewriteDeclined(f"the keys of {present} do not reach a MatMul")


def _query(g: _Graph, name: str) -> tuple[str, float, list[onnx.NodeProto]]:
    """Back from the scores MatMul's first input through constant factors: the query."""
    factor = 1.0
    passed: list[onnx.NodeProto] = []
    while True:
        node = g.producer.get(name)
        if node is None or len(g.data_consumers(name)) != 1:
            return name, factor, passed
        data = node.input[0]
        scale = _factor(g, node, data)
        if scale is None:
            return name, factor, passed
        factor *= scale
        passed.append(node)
        name = data


def _to_softmax(
    g: _Graph, scores: str
) -> tuple[onnx.NodeProto, float, float, list[onnx.NodeProto]]:
    """From the scores to their Softmax: the Softmax, the constant factor, the softcap,
    and the nodes passed (masks added are dropped)."""
    name, factor, softcap = scores, 1.0, 0.0
    passed: list[onnx.NodeProto] = []
    for _ in range(16):
        node = _only_consumer(g, name, f"the scores {name}")
        passed.append(node)
        if node.op_type == "Softmax":
            return node, factor, softcap, passed
        scale = _factor(g, node, name)
        if scale is not None:
            capped = _softcap(g, node, scale)
            if capped is not None:
                softcap, cap_nodes = capped
                passed += cap_nodes
                name = cap_nodes[-1].output[0]
                continue
            if softcap:  # the kernel scales before its cap, never after
                raise RewriteDeclined(f"the scores {scores} are scaled after their soft-cap")
            factor *= scale
        elif node.op_type == "Add" or (node.op_type == "Where" and node.input[2] == name):
            _check_mask(g, node, name, scores)
        elif node.op_type != "Cast":
            raise RewriteDeclined(f"the scores {scores} pass a {node.op_type}")
        name = node.output[0]
    raise RewriteDeclined(f"the scores {scores} do not reach a Softmax")


def _softcap(
    g: _Graph, node: onnx.NodeProto, scale: float
) -> tuple[float, list[onnx.NodeProto]] | None:
    """A soft-cap starting at `node` (Div by the cap, Tanh, Mul by it): the cap and the
    Tanh and Mul nodes; None for anything else."""
    tanh = g.data_consumers(node.output[0])
    if node.op_type != "Div" or len(tanh) != 1 or tanh[0].op_type != "Tanh":
        return None
    back = g.data_consumers(tanh[0].output[0])
    cap = 1.0 / scale
    if len(back) == 1 and _factor(g, back[0], tanh[0].output[0]) == cap:
        return cap, [tanh[0], back[0]]
    return None


def _check_mask(g: _Graph, node: onnx.NodeProto, name: str, scores: str) -> None:
    """A mask added to the scores, or applied by selection: the kernel's own causal and
    window bounds replace it, so it must carry nothing else (ALiBi slopes, a bias)."""
    for operand in node.input:
        if operand != name and _carries_weights(g, operand):
            raise RewriteDeclined(
                f"the scores {scores} get a {node.op_type} of more than a mask "
                "(a bias computed from weights, such as ALiBi)"
            )


def _to_output(g: _Graph, probs: str) -> tuple[str, list[onnx.NodeProto]]:
    """From the Softmax to the layer's attention output [batch, tokens, hidden]: through
    an optional NaN guard, the MatMul with the values, Transpose(0, 2, 1, 3), Reshape."""
    passed: list[onnx.NodeProto] = []
    name = probs
    for _ in range(4):
        nodes = g.data_consumers(name)
        guard = [n for n in nodes if n.op_type in ("IsNaN", "Where", "Cast")]
        matmul = [n for n in nodes if n.op_type == "MatMul" and n.input[0] == name]
        if matmul and len(nodes) == 1:
            node = matmul[0]
            break
        where = [n for n in guard if n.op_type in ("Where", "Cast")]
        if not where or len(nodes) != len(guard):
            raise RewriteDeclined(f"the probabilities {probs} reach {[n.op_type for n in nodes]}")
        passed += guard
        name = where[-1].output[0]
    else:
        raise RewriteDeclined(f"the probabilities {probs} do not reach a MatMul")
    passed.append(node)
    transpose = g.data_consumers(node.output[0])
    if len(transpose) != 1 or transpose[0].op_type != "Transpose":
        raise RewriteDeclined("the attention output is not transposed back")
    perm = next((list(a.ints) for a in transpose[0].attribute if a.name == "perm"), [])
    reshape = g.data_consumers(transpose[0].output[0])
    if perm != [0, 2, 1, 3] or len(reshape) != 1 or reshape[0].op_type != "Reshape":
        raise RewriteDeclined("the attention output is not [batch, tokens, hidden]")
    passed += [transpose[0], reshape[0]]
    return reshape[0].output[0], passed


def _carries_weights(g: _Graph, name: str, budget: int = 400) -> bool:
    """Whether `name` is computed from a non-scalar float constant (weights, slopes), as
    opposed to the attention mask, shapes and scalars (a mask's fill value)."""
    stack, seen = [name], set()
    while stack and budget:
        current = stack.pop()
        if current in seen or not current:
            continue
        seen.add(current)
        budget -= 1
        init = g.initializers.get(current)
        if init is not None:
            if _float_array(numpy_helper.to_array(init)):
                return True
            continue
        node = g.producer.get(current)
        if node is None or node.op_type in ("Shape", "Size"):
            continue  # an input, or only the shape of what came before
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and _float_array(numpy_helper.to_array(value)):
                return True
            continue
        stack.extend(node.input)
    return budget == 0  # too far to tell: as if it did


def _float_array(array: Any) -> bool:
    return bool(array.dtype.kind == "f" and array.size > 1)


def _reaches(g: _Graph, name: str, source: str) -> bool:
    """Whether `name` is `source` passed through repeat and layout ops only."""
    for _ in range(16):
        if name == source:
            return True
        node = g.producer.get(name)
        if node is None or node.op_type not in _PASS_THROUGH:
            return False
        name = node.input[0]
    return False


MIN_OPSET = 13
"""ai.onnx opset the rewrite's own nodes need (ReduceSum with axes as an input)."""


def _check_graph(model: onnx.ModelProto) -> None:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise RewriteDeclined(f"the graph's opset is {opset}; the rewrite needs {MIN_OPSET}")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in model.graph.node for a in n.attribute):  # fmt: skip
        raise RewriteDeclined("the graph has subgraphs (If, Loop or Scan)")


def find_attention(model: onnx.ModelProto, num_layers: int) -> list[Attention]:
    """Each layer's attention; RewriteDeclined naming the first layer that is not one."""
    _check_graph(model)
    g = _Graph(model.graph)
    found = []
    for layer in range(num_layers):
        concats = []
        for kind in ("key", "value"):
            node = g.producer.get(f"present.{layer}.{kind}")
            past = f"past_key_values.{layer}.{kind}"
            if node is None or node.op_type != "Concat" or list(node.input)[:1] != [past]:
                raise RewriteDeclined(f"present.{layer}.{kind} is not Concat({past}, new)")
            concats.append(node)
        scores, k_factor, k_nodes = _follow_keys(g, f"present.{layer}.key")
        query, q_factor, q_nodes = _query(g, scores.input[0])
        softmax, s_factor, softcap, s_nodes = _to_softmax(g, scores.output[0])
        output, o_nodes = _to_output(g, softmax.output[0])
        values = next(n for n in o_nodes if n.op_type == "MatMul")
        if not _reaches(g, values.input[1], f"present.{layer}.value"):
            raise RewriteDeclined(f"layer {layer}'s probabilities multiply other values")
        found.append(
            Attention(
                layer,
                query,
                concats[0].input[1],
                concats[1].input[1],
                output,
                k_factor * q_factor * s_factor,
                softcap,
                [*concats, *k_nodes, *q_nodes, scores, *s_nodes, *o_nodes],
            )
        )
    return found


def rewrite_attention(
    model: onnx.ModelProto,
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    windows: Sequence[int | None] = (),
) -> onnx.ModelProto:
    """A copy of `model` with every layer's attention one GroupQueryAttention over a
    past-and-present buffer; `windows[i]`: layer i's sliding window (None: none).
    RewriteDeclined when a layer is not one the rewrite can express."""
    layers = find_attention(model, num_layers)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    drop = {id(n) for a in layers for n in a.nodes}
    keep = [n for n in model.graph.node if id(n) not in drop]
    new = _lengths()
    for attention in layers:
        window = windows[attention.layer] if attention.layer < len(windows) else None
        new += _gqa(attention, num_heads, num_kv_heads, window)
    del graph.node[:]
    graph.node.extend(_sorted(keep + new))
    _prune(graph)
    if not any(op.domain == "com.microsoft" for op in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def _lengths() -> list[onnx.NodeProto]:
    """seqlens_k (each row's count of mask ones, minus one) and the total sequence length
    (the mask's width), as GroupQueryAttention takes them (int32)."""
    one = helper.make_tensor("tensord_one", TensorProto.INT64, [], [1])
    axes = helper.make_tensor("tensord_axis1", TensorProto.INT64, [1], [1])
    return [
        helper.make_node("Constant", [], ["tensord_one"], value=one),
        helper.make_node("Constant", [], ["tensord_axis1"], value=axes),
        helper.make_node(
            "ReduceSum", ["attention_mask", "tensord_axis1"], ["tensord_mask_count"], keepdims=0
        ),
        helper.make_node("Sub", ["tensord_mask_count", "tensord_one"], ["tensord_seqlens64"]),
        helper.make_node("Cast", ["tensord_seqlens64"], [_SEQLENS], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["tensord_mask_shape"]),
        helper.make_node("Gather", ["tensord_mask_shape", "tensord_one"], ["tensord_total64"]),
        helper.make_node("Cast", ["tensord_total64"], [_TOTAL], to=TensorProto.INT32),
    ]


def _gqa(
    attention: Attention, num_heads: int, num_kv_heads: int, window: int | None
) -> list[onnx.NodeProto]:
    """[batch, heads, tokens, head] inputs to [batch, tokens, heads x head], and the node."""
    layer = attention.layer
    flat = f"tensord_flat_{layer}"
    nodes = [
        helper.make_node(
            "Constant",
            [],
            [flat],
            value=helper.make_tensor(flat, TensorProto.INT64, [3], [0, 0, -1]),
        )
    ]
    inputs = []
    for part, name in (("q", attention.query), ("k", attention.key), ("v", attention.value)):
        moved = f"tensord_{part}_{layer}_bsnh"
        packed = f"tensord_{part}_{layer}_packed"
        nodes.append(helper.make_node("Transpose", [name], [moved], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [moved, flat], [packed]))
        inputs.append(packed)
    attributes: dict[str, Any] = {
        "num_heads": num_heads,
        "kv_num_heads": num_kv_heads,
        "scale": attention.scale,
        "do_rotary": 0,
    }
    if attention.softcap:
        attributes["softcap"] = attention.softcap
    if window is not None:
        attributes["local_window_size"] = window
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [
                *inputs,
                f"past_key_values.{layer}.key",
                f"past_key_values.{layer}.value",
                _SEQLENS,
                _TOTAL,
            ],
            [attention.output, f"present.{layer}.key", f"present.{layer}.value"],
            name=f"tensord_gqa_{layer}",
            domain="com.microsoft",
            **attributes,
        )
    )
    return nodes


def _sorted(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` in an order where each comes after those it reads from (stable)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    order: list[int] = []
    state = [0] * len(nodes)  # 0 new, 1 on the stack, 2 placed
    for root in range(len(nodes)):
        stack = [(root, iter(nodes[root].input))]
        if state[root]:
            continue
        state[root] = 1
        while stack:
            index, inputs = stack[-1]
            for name in inputs:
                before = producer.get(name)
                if before is not None and not state[before]:
                    state[before] = 1
                    stack.append((before, iter(nodes[before].input)))
                    break
            else:
                stack.pop()
                state[index] = 2
                order.append(index)
    return [nodes[i] for i in order]


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes and initializers no graph output needs any more (the export's own
    mask arithmetic, the repeat of keys and values)."""
    needed = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    used = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(used)


MIXED_WINDOW_KEYS = ("max_window_layers", "sliding_window_pattern", "sliding_window_layers")
"""config.json keys by which a family windows only some layers."""
MIXED_WINDOW_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "cohere2"})
"""Families whose layers alternate between windowed and full attention."""


def layer_windows(config: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window from config.json, as transformers reads it:
    `layer_types` ("sliding_attention" layers), else `sliding_window` for every layer
    unless `use_sliding_window` is false; None where a layer attends to everything.
    RewriteDeclined where the config windows only some layers by a rule of its own."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return (None,) * num_layers
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return tuple(window if t == "sliding_attention" else None for t in types)
    if config.get("use_sliding_window") is False:
        return (None,) * num_layers
    mixed = [key for key in MIXED_WINDOW_KEYS if key in config]
    if mixed or config.get("model_type") in MIXED_WINDOW_TYPES:
        # Which layers are windowed is a family's own rule here; the load check's short
        # sequences could not tell a wrong guess (the windows are thousands long).
        raise RewriteDeclined(
            f"config.json sets a sliding window of {window} without layer_types, and "
            f"{', '.join(mixed) or config.get('model_type')} says it is not on every layer"
        )
    return (window,) * num_layers


ALIBI_TYPES = frozenset({"bloom", "mpt", "falcon"})
"""Families whose attention adds ALiBi position biases (Falcon when its config.json sets
alibi): GroupQueryAttention has no such bias."""


def rewrite_export(spec: GeneratorSpec) -> bytes:
    """An Optimum export's graph with its attention on GroupQueryAttention (and a
    position_ids input for a graph that counts positions from its past), serialized;
    the weights stay in their files. RewriteDeclined says why not."""
    config = _config(spec)
    if spec.model_type in ALIBI_TYPES and config.get("alibi", spec.model_type != "falcon"):
        raise RewriteDeclined(
            f"{spec.model_type} attention adds ALiBi position biases, which "
            "GroupQueryAttention does not"
        )
    if spec.kv_dtype.numpy.kind != "f":
        raise RewriteDeclined(f"its KV cache is {spec.kv_dtype.name}")
    model = onnx.load(str(spec.model_path), load_external_data=False)
    if not spec.has_position_ids:
        added = add_position_ids(model)
        if added is None:
            raise RewriteDeclined(
                "it takes no position_ids and its rotary embedding is not the traced pattern"
            )
        model = added
    rewritten = rewrite_attention(
        model,
        num_layers=spec.num_layers,
        num_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        windows=layer_windows_of(spec),
    )
    return rewritten.SerializeToString()


def _config(spec: GeneratorSpec) -> dict[str, Any]:
    loaded = json.loads(spec.config_path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def layer_windows_of(spec: GeneratorSpec) -> tuple[int | None, ...]:
    """layer_windows of the export's config.json (RewriteDeclined as there)."""
    return layer_windows(_config(spec), spec.num_layers)
