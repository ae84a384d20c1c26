"""A generator directory: Hugging Face Optimum's text-generation-with-past export, or an
ONNX Runtime GenAI model-builder folder (genai_config.json instead of config.json; see
genai_config.py).

  model.onnx               decoder with past_key_values inputs and present outputs
  model.onnx_data          optional: its weights, when exported as external data
  tokenizer.json           for the Hugging Face `tokenizers` library
  config.json              layers, heads, vocabulary, context length, token ids
  generation_config.json   optional: eos/bos/pad ids and default sampling values
  tokenizer_config.json    optional: add_bos_token, bos_token, eos_token, pad_token,
                           chat_template
  chat_template.jinja      optional: the chat template (wins over tokenizer_config's)

`load_generator_dir` reads all of it into a frozen `GeneratorSpec` plus the tokenizer. Every
problem is a ModelLoadError that names the file and the field. The ONNX graph is read
without its weights; where the export fixed the KV heads, head size or vocabulary in the
graph they must agree with config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.files import read_regular_file
from tensord.generate.model.genai_config import GENAI_CONFIG_FILE, GenaiConfig, read_genai_config
from tensord.generate.model.graph_io import (
    POSITION_IDS,
    DecoderGraph,
    past_names,
    present_names,
    read_decoder_graph,
)
from tensord.generate.model.hf_config import (
    CHAT_TEMPLATE_FILE,
    ChatTemplate,
    FileDefaults,
    JsonFile,
    read_chat_template,
    read_generation_defaults,
    token_ids,
)

MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MAX_TOKENIZER_BYTES = 128 * 1024 * 1024
"""The largest tokenizer.json read: several times the largest published vocabularies."""
GENERATOR_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)
"""The files that make a directory a generator (beside the model file)."""

# config.json spellings of one value, in the order transformers' config classes map them
# (their `attribute_map`s): GPT-2 and BLOOM write n_head and n_layer, MPT n_heads, n_layers,
# d_model and max_seq_len, Falcon num_kv_heads, ChatGLM multi_query_group_num.
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_HEAD_DIM = ("head_dim", "kv_channels")
_CONTEXT = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "n_ctx",
)


def is_generator_dir(directory: Path, model_file: str = MODEL_FILE) -> bool:
    """True when `directory` holds the model file, tokenizer.json and config.json (an
    Optimum export) or genai_config.json (a model-builder folder)."""
    return all((directory / name).is_file() for name in (model_file, TOKENIZER_FILE)) and any(
        (directory / name).is_file() for name in (CONFIG_FILE, GENAI_CONFIG_FILE)
    )


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
    context_length: int | None
    """Longest sequence (prompt + generated) the model's positions allow; None when
    config.json gives none (ALiBi models: [generator] max_model_len, else
    DEFAULT_CONTEXT_LENGTH)."""
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
    defaults: FileDefaults
    """Sampling defaults from generation_config.json."""
    notes: tuple[str, ...] = ()
    """What the load settled that the log should say (config.json and the graph disagreed
    and the graph won; a default stood in for a missing value)."""
    chat_template: ChatTemplate | None = None
    """tokenizer_config.json's chat template; None when it has none (no chat API)."""
    genai: GenaiConfig | None = None
    """genai_config.json for a model-builder folder (fused attention, served on KV slots);
    None for an Optimum export."""

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


INLINE_TOKENIZE_CHARS = 2048
"""Texts up to this long are tokenised where they are (microseconds); longer ones on a
worker thread, through `encode_text`."""


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokenizer's ids for `text`, no special tokens added. `Tokenizer.encode` holds
    the GIL for the whole text (seconds for a few megabytes, while every other thread, the
    event loop's included, waits); `encode_batch` releases it while it works, so a long
    text goes that way. Both give the same ids."""
    if len(text) <= INLINE_TOKENIZE_CHARS:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids
    (encoding,) = tokenizer.encode_batch([text], add_special_tokens=False)
    return list(encoding.ids)


@dataclass(slots=True, frozen=True)
class GeneratorDirectory:
    """A generator directory read from disk: its spec and its tokenizer."""

    spec: GeneratorSpec
    tokenizer: Tokenizer
    max_token_bytes: int = 1
    """The most UTF-8 bytes any token's text takes (added tokens included), as the
    vocabulary writes it: a prompt of B bytes has at least B / max_token_bytes tokens."""

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids for a text prompt: the tokenizer's own ids, after BOS when the model
        wants one (never an EOS or other suffix the post-processor would add)."""
        ids = encode_text(self.tokenizer, text)
        if self.spec.add_bos_token and self.spec.bos_token_id is not None:
            return [self.spec.bos_token_id, *ids]
        return ids


def load_tokenizer(path: Path) -> Tokenizer:
    """tokenizer.json, read as a regular file of bounded size and handed to `tokenizers`
    as text (the library would open a FIFO and wait, and read any size), with the
    truncation and padding a file may set turned off, as transformers' calls do by
    default: a prompt is never cut short or padded on its way in."""
    expected = (
        f"a tokenizer.json of at most {MAX_TOKENIZER_BYTES >> 20} MiB (the largest "
        "vocabularies take a few tens of MB)"
    )
    raw = read_regular_file(path, MAX_TOKENIZER_BYTES, ModelLoadError, expected)
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except Exception as exc:
        raise ModelLoadError(f"{path}: the tokenizers library cannot read it: {exc}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _config_kv_heads(config: JsonFile, heads: int) -> int:
    """KV heads as transformers reads them: Falcon and GPT-BigCode with multi_query (and
    not Falcon's new_decoder_architecture) share one; MPT nests kv_n_heads in attn_config."""
    if config.bool_or_none("multi_query") and not config.bool_or_none("new_decoder_architecture"):
        return 1
    attn = config.data.get("attn_config")
    if isinstance(attn, dict) and attn.get("kv_n_heads") is not None:
        nested = JsonFile(config.path, attn).int_or_none(("kv_n_heads",))
        if nested is not None:
            return nested
    return config.int_or_none(_KV_HEADS) or heads


def _graph_wins(
    config: JsonFile, field: str, value: int, in_graph: int | None, where: str, notes: list[str]
) -> int:
    """The graph's value where the export fixed it; a disagreement with config.json is
    noted (the graph is what runs)."""
    if in_graph is None or in_graph == value:
        return value
    notes.append(
        f"{config.path.name if config.path else 'config.json'} gives {field} "
        f"{value}, but {where} {in_graph}; using {in_graph}"
    )
    return in_graph


def _check_mla(config: JsonFile, graph: DecoderGraph, model_path: Path) -> None:
    """Keys and values of different head sizes (multi-head latent attention, as DeepSeek-V3
    writes it) cannot share the paged KV pool, which holds one head size."""
    keys, values = graph.head_dim, graph.value_head_dim
    if keys is None or values is None:
        rope = config.int_or_none(("qk_rope_head_dim",), minimum=0)
        nope = config.int_or_none(("qk_nope_head_dim",), minimum=0)
        values = config.int_or_none(("v_head_dim",))
        keys = None if rope is None or nope is None else rope + nope
    if keys is not None and values is not None and keys != values:
        raise ModelLoadError(
            f"{model_path}: its keys have head size {keys} and its values {values} "
            "(multi-head latent attention, as DeepSeek-V3 exports it); tensord's paged KV "
            "cache holds keys and values of one head size, so Generate cannot serve it"
        )


def _shape(
    config: JsonFile, graph: DecoderGraph, model_path: Path, notes: list[str]
) -> dict[str, Any]:
    """Layers, heads, head size, vocabulary and context, from config.json and the graph."""
    heads = config.require_int(_HEADS)
    hidden = config.int_or_none(_HIDDEN)
    layers = config.int_or_none(_LAYERS)
    if layers is not None and layers != graph.num_layers:
        raise ModelLoadError(
            f"{config.path}: {_LAYERS[0]} is {layers}, but {model_path} has past_key_values "
            f"for {graph.num_layers} layers"
        )
    _check_mla(config, graph, model_path)
    kv_heads = _config_kv_heads(config, heads)
    head_dim = config.int_or_none(_HEAD_DIM)
    if head_dim is None:
        head_dim = hidden // heads if hidden is not None else graph.head_dim
    if head_dim is None:
        head_dim = config.require_int((*_HEAD_DIM, *_HIDDEN))  # raises, naming the fields
    vocab = config.int_or_none(("vocab_size", "padded_vocab_size")) or graph.vocab_size
    if vocab is None:
        vocab = config.require_int(("vocab_size",))  # raises, naming the field
    where = f"the past_key_values inputs of {model_path.name} have"
    kv_heads = _graph_wins(config, "KV heads", kv_heads, graph.kv_heads, f"{where} KV heads", notes)
    if heads % kv_heads:
        raise ModelLoadError(
            f"{config.path}: num_attention_heads {heads} is not a multiple of the KV heads "
            f"{kv_heads}"
        )
    context = config.int_or_none(_CONTEXT)
    if context is None:
        name = config.path.name if config.path else "config.json"
        notes.append(
            f"{name} gives no context length ({', '.join(_CONTEXT[:4])}, ...): "
            "max_model_len is [generator] max_model_len in model.toml, else the default"
        )
    return {
        "num_layers": graph.num_layers,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": _graph_wins(
            config, "head size", head_dim, graph.head_dim, f"{where} head size", notes
        ),
        "hidden_size": hidden if hidden is not None else heads * head_dim,
        "vocab_size": _graph_wins(
            config,
            "vocab_size",
            vocab,
            graph.vocab_size,
            f"the logits of {model_path.name} have size",
            notes,
        ),
        "context_length": context,
    }


def _optional(directory: Path, name: str) -> Path | None:
    """The optional file's path when something is there (JsonFile.read refuses what is not
    a regular file), else None."""
    path = directory / name
    return path if path.exists() else None


def _config_source(directory: Path, model_file: str) -> tuple[JsonFile, GenaiConfig | None]:
    """config.json (an Optimum export) or, without it, genai_config.json (a builder folder)
    under config.json's field names; ModelLoadError naming what is missing, the model
    file and tokenizer.json included."""
    genai_path = directory / GENAI_CONFIG_FILE
    builder = not (directory / CONFIG_FILE).exists() and genai_path.exists()
    needed = (model_file, TOKENIZER_FILE, *(() if builder else (CONFIG_FILE,)))
    missing = [n for n in needed if not (directory / n).exists()]
    if missing:
        raise ModelLoadError(
            f"{directory}: a generator directory holds {model_file}, tokenizer.json and "
            f"config.json (an Optimum export) or genai_config.json (a model-builder folder); "
            f"{', '.join(missing)} is missing"
        )
    if builder:
        genai = read_genai_config(genai_path)
        return genai.config, genai
    return JsonFile.read(directory / CONFIG_FILE, required=True), None


def load_generator_dir(directory: Path, model_file: str = MODEL_FILE) -> GeneratorDirectory:
    """Read and check a generator directory; raises ModelLoadError naming file and field."""
    directory = Path(directory)
    config, genai = _config_source(directory, model_file)
    model_path = directory / model_file
    if not model_path.is_file():  # the JSON files' reader refuses what is not a file
        raise ModelLoadError(f"{model_path} is not a regular file")
    graph = read_decoder_graph(model_path)
    generation_path = _optional(directory, GENERATION_CONFIG_FILE)
    tokenizer_config_path = _optional(directory, TOKENIZER_CONFIG_FILE)
    generation = JsonFile.read(generation_path)
    if genai is not None and generation_path is None:
        generation = genai.search  # the builder's sampling defaults
    tokenizer_config = JsonFile.read(tokenizer_config_path)
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    notes: list[str] = []
    shape = _shape(config, graph, model_path, notes)
    ids = token_ids(config, generation, tokenizer_config, tokenizer, shape["vocab_size"])
    spec = GeneratorSpec(
        directory=directory,
        model_path=model_path,
        tokenizer_path=directory / TOKENIZER_FILE,
        config_path=config.path or directory / CONFIG_FILE,
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
        notes=tuple(notes),
        chat_template=read_chat_template(
            tokenizer_config, _optional(directory, CHAT_TEMPLATE_FILE)
        ),
        genai=genai,
        **shape,
    )
    return GeneratorDirectory(spec, tokenizer, _max_token_bytes(tokenizer))


def _max_token_bytes(tokenizer: Tokenizer) -> int:
    """The longest token text in UTF-8 bytes. Byte-level vocabularies write each byte as a
    character of one or two bytes, SentencePiece writes a space as three: never less than
    the text a token stands for."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(token.encode()) for token in vocab), default=1) or 1


def read_generator_spec(directory: Path, model_file: str = MODEL_FILE) -> GeneratorSpec:
    """The spec alone (loads the tokenizer too: BOS/EOS may be named by token text)."""
    return load_generator_dir(directory, model_file).spec
