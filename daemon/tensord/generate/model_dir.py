"""A generator directory, in the layout Hugging Face Optimum exports (text-generation-with-past).

  model.onnx               decoder with past_key_values inputs and present outputs
  model.onnx_data          optional: its weights, when exported as external data
  tokenizer.json           for the Hugging Face `tokenizers` library
  config.json              layers, heads, vocabulary, context length, token ids
  generation_config.json   optional: eos/bos/pad ids and default sampling values
  tokenizer_config.json    optional: add_bos_token, bos_token, eos_token, pad_token

`load_generator_dir` reads all of it into a frozen `GeneratorSpec` plus the tokenizer. Every
problem is a ModelLoadError that names the file and the field. The ONNX graph is read
without its weights; where the export fixed the KV heads, head size or vocabulary in the
graph they must agree with config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.generate.graph_io import (
    POSITION_IDS,
    DecoderGraph,
    past_names,
    present_names,
    read_decoder_graph,
)
from tensord.generate.hf_config import (
    GenerationDefaults,
    JsonFile,
    read_generation_defaults,
    token_ids,
)

MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATOR_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)
"""The files that make a directory a generator (beside the model file)."""

_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_CONTEXT = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def is_generator_dir(directory: Path, model_file: str = MODEL_FILE) -> bool:
    """True when `directory` holds the model file, config.json and tokenizer.json."""
    return all((directory / name).is_file() for name in (model_file, CONFIG_FILE, TOKENIZER_FILE))


@dataclass(slots=True, frozen=True)
class GeneratorSpec:
    """Everything the engine needs to know about one generator directory."""

    directory: Path
    model_path: Path
    tokenizer_path: Path
    config_path: Path
    generation_config_path: Path | None
    tokenizer_config_path: Path | None
    external_data_paths: tuple[Path, ...]
    """Files holding the weights outside model.onnx (empty when inline)."""
    model_type: str
    """config.json's model_type ("llama", "gpt2", ...), "" when absent."""
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    """Heads of the KV cache; fewer than num_attention_heads for grouped-query attention."""
    head_dim: int
    hidden_size: int
    vocab_size: int
    """Length of the logits' last dimension: the ids the sampler picks from."""
    context_length: int
    """Longest sequence (prompt + generated) the model's positions allow."""
    kv_dtype: DType
    """Element type of past_key_values and present (the KV pool's dtype)."""
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    eos_token_ids: tuple[int, ...]
    """Tokens that end a sequence (empty: only the length limit ends it)."""
    bos_token_id: int | None
    add_bos_token: bool
    """Whether a text prompt starts with bos_token_id (tokenizer_config.json, else whether
    tokenizer.json's post-processor adds it)."""
    pad_token_id: int | None
    defaults: GenerationDefaults
    """Sampling defaults from generation_config.json."""

    @property
    def has_position_ids(self) -> bool:
        """Some exports leave position_ids out; the graph then counts positions itself."""
        return POSITION_IDS in self.input_names

    @property
    def past_input_names(self) -> tuple[tuple[str, str], ...]:
        """(key, value) input names per layer."""
        return tuple(past_names(i) for i in range(self.num_layers))

    @property
    def present_output_names(self) -> tuple[tuple[str, str], ...]:
        """(key, value) output names per layer."""
        return tuple(present_names(i) for i in range(self.num_layers))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token takes across all layers (keys and values)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype.itemsize


@dataclass(slots=True, frozen=True)
class GeneratorDirectory:
    """A generator directory read from disk: its spec and its tokenizer."""

    spec: GeneratorSpec
    tokenizer: Tokenizer

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids for a text prompt: the tokenizer's own ids, after BOS when the model
        wants one (never an EOS or other suffix the post-processor would add)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.spec.add_bos_token and self.spec.bos_token_id is not None:
            return [self.spec.bos_token_id, *ids]
        return ids


def _load_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: the tokenizers library cannot read it: {exc}") from None


def _agree(config: JsonFile, field: str, value: int, in_graph: int | None, where: str) -> int:
    """config.json's value, which must equal the graph's where the export fixed it."""
    if in_graph is not None and in_graph != value:
        raise ModelLoadError(f"{config.path}: {field} is {value}, but {where} {in_graph}")
    return value


def _shape(config: JsonFile, graph: DecoderGraph, model_path: Path) -> dict[str, int]:
    """Layers, heads, head size, vocabulary and context, from config.json and the graph."""
    heads = config.require_int(_HEADS)
    hidden = config.int_or_none(_HIDDEN)
    layers = config.int_or_none(_LAYERS)
    if layers is not None and layers != graph.num_layers:
        raise ModelLoadError(
            f"{config.path}: {_LAYERS[0]} is {layers}, but {model_path} has past_key_values "
            f"for {graph.num_layers} layers"
        )
    kv_heads = config.int_or_none(_KV_HEADS) or graph.kv_heads or heads
    head_dim = config.int_or_none(("head_dim",))
    if head_dim is None:
        head_dim = hidden // heads if hidden is not None else graph.head_dim
    if head_dim is None:
        head_dim = config.require_int(("head_dim", *_HIDDEN))  # raises, naming the fields
    vocab = config.int_or_none(("vocab_size",)) or graph.vocab_size
    if vocab is None:
        vocab = config.require_int(("vocab_size",))  # raises, naming the field
    if heads % kv_heads:
        raise ModelLoadError(
            f"{config.path}: num_attention_heads {heads} is not a multiple of the KV heads "
            f"{kv_heads}"
        )
    return {
        "num_layers": graph.num_layers,
        "num_attention_heads": heads,
        "num_kv_heads": _agree(
            config,
            "num_key_value_heads",
            kv_heads,
            graph.kv_heads,
            f"the past_key_values inputs of {model_path} have KV heads",
        ),
        "head_dim": _agree(
            config,
            "head_dim",
            head_dim,
            graph.head_dim,
            f"the past_key_values inputs of {model_path} have head size",
        ),
        "hidden_size": hidden if hidden is not None else heads * head_dim,
        "vocab_size": _agree(
            config, "vocab_size", vocab, graph.vocab_size, f"the logits of {model_path} have size"
        ),
        "context_length": config.require_int(_CONTEXT),
    }


def _optional(directory: Path, name: str) -> Path | None:
    path = directory / name
    return path if path.is_file() else None


def load_generator_dir(directory: Path, model_file: str = MODEL_FILE) -> GeneratorDirectory:
    """Read and check a generator directory; raises ModelLoadError naming file and field."""
    directory = Path(directory)
    needed = (model_file, CONFIG_FILE, TOKENIZER_FILE)
    missing = [n for n in needed if not (directory / n).is_file()]
    if missing:
        raise ModelLoadError(
            f"{directory}: a generator directory holds {model_file}, config.json and "
            f"tokenizer.json; {', '.join(missing)} is missing"
        )
    model_path = directory / model_file
    graph = read_decoder_graph(model_path)
    config = JsonFile.read(directory / CONFIG_FILE, required=True)
    generation_path = _optional(directory, GENERATION_CONFIG_FILE)
    tokenizer_config_path = _optional(directory, TOKENIZER_CONFIG_FILE)
    generation = JsonFile.read(generation_path)
    tokenizer_config = JsonFile.read(tokenizer_config_path)
    tokenizer = _load_tokenizer(directory / TOKENIZER_FILE)
    shape = _shape(config, graph, model_path)
    ids = token_ids(config, generation, tokenizer_config, tokenizer, shape["vocab_size"])
    spec = GeneratorSpec(
        directory=directory,
        model_path=model_path,
        tokenizer_path=directory / TOKENIZER_FILE,
        config_path=directory / CONFIG_FILE,
        generation_config_path=generation_path,
        tokenizer_config_path=tokenizer_config_path,
        external_data_paths=graph.external_data,
        model_type=config.str_or_empty("model_type"),
        kv_dtype=graph.kv_dtype,
        input_names=graph.input_names,
        output_names=graph.output_names,
        eos_token_ids=ids.eos,
        bos_token_id=ids.bos,
        add_bos_token=ids.add_bos,
        pad_token_id=ids.pad,
        defaults=read_generation_defaults(generation),
        **shape,
    )
    return GeneratorDirectory(spec, tokenizer)


def read_generator_spec(directory: Path, model_file: str = MODEL_FILE) -> GeneratorSpec:
    """The spec alone (loads the tokenizer too: BOS/EOS may be named by token text)."""
    return load_generator_dir(directory, model_file).spec
