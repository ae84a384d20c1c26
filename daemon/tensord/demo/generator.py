"""The demo generator `tinylm`, written in the directory layout Hugging Face Optimum exports.

tinylm/
  model.onnx               Llama-style decoder (see demo_graph), seeded random weights
  tokenizer.json           byte-level BPE trained here on a seeded corpus (demo_tokenizer)
  tokenizer_config.json    <s> added before prompts, </s> ends a sequence
  config.json              Llama-style keys, including num_key_value_heads
  generation_config.json   bos/eos/pad ids and greedy decoding by default

4 layers, hidden 256, 4 attention heads sharing 2 KV heads, head_dim 64, context 2048. The
weights are random but not degenerate: the LM head is not tied to the embedding (a tied,
untrained head mostly repeats the last token), and every projection is scaled by
1/sqrt(fan_in) so attention and MLP change the residual stream: different prompts give
different greedy continuations. Nothing is downloaded; it builds in about a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
from tokenizers import Tokenizer

from tensord.demo.decoder_graph import DecoderShape, build_decoder_graph, init_weights
from tensord.demo.tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    build_tokenizer,
)

DEMO_GENERATOR = "tinylm"
EXTERNAL_DATA_FILE = "model.onnx_data"


@dataclass(slots=True, frozen=True)
class DemoGeneratorOptions:
    """What to build: the sizes are the demo's; tests may shrink them."""

    shape: DecoderShape = field(default_factory=DecoderShape)
    """The decoder's sizes; its vocab_size is what the tokenizer is trained to (the graph
    takes the size the tokenizer really reaches)."""
    seed: int = 0
    external_data: bool = False
    """Write the weights to model.onnx_data beside model.onnx, as large exports do."""


def _shape(options: DemoGeneratorOptions, vocab_size: int) -> DecoderShape:
    return replace(options.shape, vocab_size=vocab_size)


def _config_json(shape: DecoderShape, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.context_length,
        "vocab_size": shape.vocab_size,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }


def _tokenizer_config(context_length: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def save_onnx(model: onnx.ModelProto, path: Path, *, external_data: bool) -> None:
    """Save `model`; with external_data its weights go to model.onnx_data beside it."""
    if external_data:
        (path.parent / EXTERNAL_DATA_FILE).unlink(missing_ok=True)
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=EXTERNAL_DATA_FILE,
            size_threshold=1024,
        )
    else:
        onnx.save(model, str(path))


_SPECIAL = {"pad": PAD_TOKEN, "bos": BOS_TOKEN, "eos": EOS_TOKEN}


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"the demo tokenizer has no {token!r} token")
    return found


def build_demo_generator(directory: Path, options: DemoGeneratorOptions | None = None) -> Path:
    """Write the generator directory (see the module doc) and return it."""
    options = options or DemoGeneratorOptions()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(options.shape.vocab_size, options.seed)
    ids = {key: _token_id(tokenizer, token) for key, token in _SPECIAL.items()}
    shape = _shape(options, tokenizer.get_vocab_size())
    model = build_decoder_graph(shape, init_weights(shape, options.seed))
    save_onnx(model, directory / "model.onnx", external_data=options.external_data)
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", _tokenizer_config(shape.context_length))
    _write_json(directory / "config.json", _config_json(shape, ids))
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
            "do_sample": False,
            "max_new_tokens": 256,
        },
    )
    return directory
