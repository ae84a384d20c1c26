"""A Llama-style decoder as an ONNX graph in Optimum's `text-generation-with-past` layout.

inputs   input_ids int64 [B, T], attention_mask int64 [B, P+T], position_ids int64 [B, T],
         past_key_values.{i}.key / .value float32 [B, H_kv, P, D]
outputs  logits float32 [B, T, V], present.{i}.key / .value float32 [B, H_kv, P+T, D]

Per layer: RMSNorm, grouped-query attention with rotary position embeddings (the rotate-half
convention of Hugging Face's Llama), RMSNorm, SwiGLU MLP, both with residuals. Query t of
the new tokens sits at key column P+t: it sees key column j when j <= P+t and
attention_mask[b, j] == 1, so a padded past (mask zeros) and a prefill of several tokens
after a past are both exact. Weights use Hugging Face's names and [out, in] layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9  # read by every ONNX Runtime release tensord supports
MASKED = -1e9  # added where a key is not visible: no NaN even when a whole row is masked


@dataclass(slots=True, frozen=True)
class DecoderShape:
    """The sizes of a Llama-style decoder."""

    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 704
    context_length: int = 2048
    vocab_size: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


@dataclass(slots=True)
class _Builder:
    """Collects nodes and initializers, naming intermediate values uniquely."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    count: int = 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        self.count += 1
        name = out or f"{op_type.lower()}_{self.count}"
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [name], name=f"n{self.count}", **attrs)
        )
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name


def rope_tables(shape: DecoderShape) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [context_length, head_dim], as Hugging Face's Llama computes them."""
    inv_freq = 1.0 / shape.rope_theta ** (
        np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim
    )
    angles = np.outer(np.arange(shape.context_length, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _rotate_half_matrix(head_dim: int) -> np.ndarray:
    """R with x @ R == concat(-x[half:], x[:half]) (exact: entries are 0 and +-1)."""
    half = head_dim // 2
    rot = np.zeros((head_dim, head_dim), np.float32)
    rot[np.arange(half) + half, np.arange(half)] = -1.0
    rot[np.arange(half), np.arange(half) + half] = 1.0
    return rot


def _rms_norm(b: _Builder, x: str, weight: str, eps: str) -> str:
    square = b.op("Mul", x, x)
    mean = b.op("ReduceMean", square, axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean, eps)))
    return b.op("Mul", b.op("Mul", x, inv), weight)


def _mask_and_rope(b: _Builder, shape: DecoderShape) -> tuple[str, str, str]:
    """The visibility mask [B, 1, group*T, P+T] and the rotary cos/sin [B, 1, T, D].

    The mask's rows are those of the attention scores, whose queries are grouped by the KV
    head they read: row g*T + t is query t of the group's g-th head."""
    cos, sin = rope_tables(shape)
    b.const("rope_cos", cos)
    b.const("rope_sin", sin)
    b.const("axes_0", np.array([0], np.int64))
    b.const("axes_1", np.array([1], np.int64))
    b.const("axes_12", np.array([1, 2], np.int64))
    b.const("one", np.array(1, np.int64))
    past = b.op("Squeeze", b.op("Shape", "past_key_values.0.key", start=2, end=3), "axes_0")
    new = b.op("Squeeze", b.op("Shape", "input_ids", start=1, end=2), "axes_0")
    total = b.op("Add", past, new)
    rows = b.op("Unsqueeze", b.op("Range", past, total, "one"), "axes_1")  # [T, 1]
    group = shape.num_heads // shape.num_kv_heads
    rows = b.op("Tile", rows, b.const("group_rows", np.array([group, 1], np.int64)))
    cols = b.op(
        "Unsqueeze", b.op("Range", b.const("zero", np.array(0, np.int64)), total, "one"), "axes_0"
    )  # [1, P+T]
    causal = b.op("LessOrEqual", cols, rows)  # [group*T, P+T]
    keys = b.op("Unsqueeze", b.op("Cast", "attention_mask", to=TensorProto.BOOL), "axes_12")
    visible = b.op("And", causal, keys, out="visible")  # [B, 1, group*T, P+T]
    cos_bt = b.op("Unsqueeze", b.op("Gather", "rope_cos", "position_ids"), "axes_1")
    sin_bt = b.op("Unsqueeze", b.op("Gather", "rope_sin", "position_ids"), "axes_1")
    return visible, cos_bt, sin_bt


def _rope(b: _Builder, x: str, cos: str, sin: str) -> str:
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", b.op("MatMul", x, "rotate_half"), sin))


def _heads(b: _Builder, x: str, weight: str, heads: int, head_dim: int) -> str:
    """x [B, T, H] @ W -> [B, heads, T, D]."""
    shape = b.const(f"{weight}_shape", np.array([0, 0, heads, head_dim], np.int64))
    return b.op("Transpose", b.op("Reshape", b.op("MatMul", x, weight), shape), perm=[0, 2, 1, 3])


def _attention(
    b: _Builder, s: DecoderShape, i: int, x: str, visible: str, cos: str, sin: str
) -> str:
    p = f"model.layers.{i}.self_attn"
    q = _rope(b, _heads(b, x, f"{p}.q_proj.weight_t", s.num_heads, s.head_dim), cos, sin)
    k = _rope(b, _heads(b, x, f"{p}.k_proj.weight_t", s.num_kv_heads, s.head_dim), cos, sin)
    v = _heads(b, x, f"{p}.v_proj.weight_t", s.num_kv_heads, s.head_dim)
    key = b.op("Concat", f"past_key_values.{i}.key", k, axis=2, out=f"present.{i}.key")
    value = b.op("Concat", f"past_key_values.{i}.value", v, axis=2, out=f"present.{i}.value")
    # Query head h reads KV head h // group: the group's queries are the rows of one
    # [B, H_kv, group*T, D] block against that KV head's keys, with no copy of the keys per
    # query head and no broadcast MatMul (ONNX Runtime folds the key transpose and the scale
    # into one FusedMatMul).
    grouped = b.op("Reshape", q, "q_grouped_shape")
    keys_t = b.op("Transpose", key, perm=[0, 1, 3, 2])
    scores = b.op("Mul", b.op("MatMul", grouped, keys_t), "attn_scale")
    probs = b.op("Softmax", b.op("Where", visible, scores, "masked"), axis=-1)
    ctx = b.op("MatMul", probs, value)  # [B, H_kv, group*T, D]
    ctx = b.op("Reshape", ctx, "ctx_heads_shape")  # [B, H, T, D]
    merged = b.op("Reshape", b.op("Transpose", ctx, perm=[0, 2, 1, 3]), "merge_shape")
    return b.op("MatMul", merged, f"{p}.o_proj.weight_t")


def _mlp(b: _Builder, i: int, x: str) -> str:
    p = f"model.layers.{i}.mlp"
    gate = b.op("MatMul", x, f"{p}.gate_proj.weight_t")
    up = b.op("MatMul", x, f"{p}.up_proj.weight_t")
    act = b.op("Mul", b.op("Mul", gate, b.op("Sigmoid", gate)), up)
    return b.op("MatMul", act, f"{p}.down_proj.weight_t")


def _shared_constants(b: _Builder, s: DecoderShape) -> None:
    b.const("rotate_half", _rotate_half_matrix(s.head_dim))
    b.const("eps", np.array(s.rms_norm_eps, np.float32))
    b.const("attn_scale", np.array(1.0 / np.sqrt(s.head_dim), np.float32))
    b.const("masked", np.array(MASKED, np.float32))
    b.const("q_grouped_shape", np.array([0, s.num_kv_heads, -1, s.head_dim], np.int64))
    b.const("ctx_heads_shape", np.array([0, s.num_heads, -1, s.head_dim], np.int64))
    b.const("merge_shape", np.array([0, 0, s.num_heads * s.head_dim], np.int64))


def _weights_as_initializers(b: _Builder, weights: dict[str, np.ndarray]) -> None:
    for name, value in weights.items():
        if name.endswith("_proj.weight") or name == "lm_head.weight":
            b.const(f"{name}_t", np.ascontiguousarray(value.T))  # MatMul takes [in, out]
        else:
            b.const(name, value)


def _io(s: DecoderShape) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    kv_past: list[str | int] = ["batch_size", s.num_kv_heads, "past_sequence_length", s.head_dim]
    kv_present: list[str | int] = [
        "batch_size",
        s.num_kv_heads,
        "total_sequence_length",
        s.head_dim,
    ]
    inputs = [
        helper.make_tensor_value_info(
            "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]
        ),
        helper.make_tensor_value_info(
            "position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", s.vocab_size]
        )
    ]
    for i in range(s.num_layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, kv_past
                )
            )
            outputs.append(
                helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, kv_present)
            )
    return inputs, outputs


def build_decoder_graph(shape: DecoderShape, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The decoder with `weights` (Hugging Face Llama names, [out, in] projections)."""
    b = _Builder()
    _weights_as_initializers(b, weights)
    _shared_constants(b, shape)
    visible, cos, sin = _mask_and_rope(b, shape)
    x = b.op("Gather", "model.embed_tokens.weight", "input_ids")
    for i in range(shape.num_layers):
        norm = f"model.layers.{i}"
        h = _rms_norm(b, x, f"{norm}.input_layernorm.weight", "eps")
        x = b.op("Add", x, _attention(b, shape, i, h, visible, cos, sin))
        h = _rms_norm(b, x, f"{norm}.post_attention_layernorm.weight", "eps")
        x = b.op("Add", x, _mlp(b, i, h))
    h = _rms_norm(b, x, "model.norm.weight", "eps")
    b.op("MatMul", h, "lm_head.weight_t", out="logits")
    inputs, outputs = _io(shape)
    graph = helper.make_graph(b.nodes, "tinylm", inputs, outputs, b.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-demo"
    )
    model.ir_version = IR_VERSION
    model.doc_string = "tensord demo generator: a Llama-style decoder with grouped-query attention"
    onnx.checker.check_model(model)
    return model


def init_weights(shape: DecoderShape, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights in Hugging Face Llama's names and layouts ([out, in])."""
    rng = np.random.default_rng(seed)
    s = shape

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)

    weights = {"model.embed_tokens.weight": rng.normal(0, 1, (s.vocab_size, s.hidden_size))}
    for i in range(s.num_layers):
        p = f"model.layers.{i}"
        kv = s.num_kv_heads * s.head_dim
        weights |= {
            f"{p}.self_attn.q_proj.weight": linear(s.num_heads * s.head_dim, s.hidden_size),
            f"{p}.self_attn.k_proj.weight": linear(kv, s.hidden_size),
            f"{p}.self_attn.v_proj.weight": linear(kv, s.hidden_size),
            f"{p}.self_attn.o_proj.weight": linear(s.hidden_size, s.num_heads * s.head_dim),
            f"{p}.mlp.gate_proj.weight": linear(s.intermediate_size, s.hidden_size),
            f"{p}.mlp.up_proj.weight": linear(s.intermediate_size, s.hidden_size),
            f"{p}.mlp.down_proj.weight": linear(s.hidden_size, s.intermediate_size),
            f"{p}.input_layernorm.weight": np.ones(s.hidden_size),
            f"{p}.post_attention_layernorm.weight": np.ones(s.hidden_size),
        }
    weights["model.norm.weight"] = np.ones(s.hidden_size)
    weights["lm_head.weight"] = linear(s.vocab_size, s.hidden_size)
    return {name: np.asarray(value, np.float32) for name, value in weights.items()}
