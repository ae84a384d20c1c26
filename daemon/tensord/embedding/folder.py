"""A sentence-transformers folder as the Hugging Face Hub publishes it, read for serving.

  config.json                        the transformer's config (vocabulary, positions)
  tokenizer.json                     for the Hugging Face `tokenizers` library
  modules.json                       the pipeline: Transformer, Pooling, Normalize, ...
  sentence_bert_config.json          max_seq_length
  config_sentence_transformers.json  optional: prompts and the default prompt's name
  1_Pooling/config.json              the pooling mode flags
  onnx/model.onnx                    the transformer exported alone (last_hidden_state),
  or model.onnx                      or the whole pipeline (token_embeddings and
                                     sentence_embedding, `optimum-cli export onnx
                                     --library-name sentence_transformers`)

`read_embedding_folder` reads it into a frozen `EmbeddingSpec`: what the data plane tokenises
with and how long a text may be, the model's inputs and the output served, and the pooling
and normalisation that follow the run. A pipeline tensord cannot reproduce exactly (a Dense
module after pooling, say, with only the transformer exported) is refused with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tokenizers import Tokenizer

from tensord.backends.onnx_file import graph_output_names, read_onnx
from tensord.embedding.tokenizer import embedding_tokenizer, longest_token
from tensord.errors import ModelLoadError
from tensord.files import read_regular_file
from tensord.generate.model.hf_config import MAX_JSON_BYTES, JsonFile
from tensord.modelconfig.embedding import POOLING_MODES, EmbeddingConfig, PoolingMode

TOKENIZER_FILE = "tokenizer.json"
MODULES_FILE = "modules.json"
SBERT_CONFIG_FILE = "sentence_bert_config.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
HUB_MODEL_FILE = "onnx/model.onnx"
MODEL_FILE = "model.onnx"
EMBEDDING_MARKERS = (MODULES_FILE, SBERT_CONFIG_FILE)
"""Either beside tokenizer.json makes a directory a sentence-transformers folder."""

TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")
"""A transformer's per-token vectors, as Optimum names them (alone, and in a pipeline)."""
POOLED_OUTPUT = "sentence_embedding"
"""A whole pipeline's vector (pooling and every later module run in the graph)."""
INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS, POSITION_IDS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "position_ids",
)
_KNOWN_INPUTS = (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS, POSITION_IDS)

_MODULE_PREFIX = "sentence_transformers.models."
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
_FLAG_OF_MODE: dict[PoolingMode, str] = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
# Position ids that start after the padding index (transformers' create_position_ids_from_
# input_ids): a table of max_position_embeddings rows holds that many less 2 tokens.
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet", "longformer"})
_MAX_SANE_LENGTH = 1 << 20
"""tokenizer_config.json's model_max_length above this means "no limit" (transformers
writes 1e30 for it)."""


@dataclass(slots=True, frozen=True)
class EmbeddingSpec:
    """Everything serving one embedding folder needs, read from its files."""

    directory: Path
    model_path: Path
    tokenizer_path: Path
    max_seq_length: int
    """Tokens a text may have, special tokens included."""
    pooling: tuple[PoolingMode, ...]
    """The modes whose vectors are concatenated; empty when the graph pools."""
    normalize: bool
    """Vectors are scaled to unit length after pooling (by tensord, or in the graph)."""
    output: str
    """The model output served: per-token vectors to pool, or the pipeline's vector."""
    inputs: tuple[str, ...]
    """The model's inputs, each one of input_ids, attention_mask, token_type_ids,
    position_ids."""
    pad_token_id: int
    vocab_size: int
    """Token ids are below this (the model's embedding table)."""
    dimensions: int
    """The length of a vector (0: known once the model has run)."""
    prompt: str = ""
    """Put before every text (config_sentence_transformers.json's default prompt)."""
    model_type: str = ""
    lowercase: bool = False
    """Texts are lowercased first (sentence_bert_config.json's do_lower_case)."""
    max_token_chars: int = 1
    """The most characters one token of the vocabulary stands for (a bound: a text of
    n x this many characters has at least n tokens)."""
    tokenizer: Tokenizer | None = field(default=None, compare=False, repr=False)
    """The folder's tokenizer, truncating at max_seq_length (embedding_tokenizer)."""

    @property
    def graph_pools(self) -> bool:
        return self.output == POOLED_OUTPUT

    def describe(self) -> str:
        """One line for Info and `tensord inspect`."""
        if self.graph_pools:
            how = f"{self.output!r} of the graph (pooling in the export)"
        else:
            how = f"{'+'.join(self.pooling)} pooling of {self.output!r}"
        norm = ", normalised" if self.normalize and not self.graph_pools else ""
        dims = f"{self.dimensions} dimensions, " if self.dimensions else ""
        return f"{dims}{how}{norm}, at most {self.max_seq_length} tokens a text"


def embedding_model_file(directory: Path) -> str | None:
    """The model file of a sentence-transformers folder: onnx/model.onnx (the Hub's place
    for it) when present, else model.onnx; None when `directory` is not such a folder."""
    if not is_embedding_dir(directory):
        return None
    if (directory / HUB_MODEL_FILE).is_file():
        return HUB_MODEL_FILE
    return MODEL_FILE


def is_embedding_dir(directory: Path, model_file: str = MODEL_FILE) -> bool:
    """tokenizer.json, and modules.json (or sentence_bert_config.json) or a model file
    whose graph outputs sentence_embedding (what Optimum's sentence-transformers export
    writes, without the pipeline's files)."""
    if not (directory / TOKENIZER_FILE).is_file():
        return False
    if any((directory / name).is_file() for name in EMBEDDING_MARKERS):
        return True
    model = directory / model_file
    return model.is_file() and POOLED_OUTPUT in graph_output_names(model)


def read_embedding_folder(
    directory: Path, model_file: str, config: EmbeddingConfig | None = None
) -> EmbeddingSpec:
    """The folder's spec (model.toml's [embedding] overrides applied); ModelLoadError
    naming the file and the field when it cannot be served as it is."""
    config = config or EmbeddingConfig()
    model_path = directory / model_file
    tokenizer_path = directory / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise ModelLoadError(f"{directory}: an embedding model needs {TOKENIZER_FILE}")
    hf = JsonFile.read(directory / "config.json")
    sbert = JsonFile.read(directory / SBERT_CONFIG_FILE)
    st = JsonFile.read(directory / ST_CONFIG_FILE)
    modules = _read_modules(directory)
    graph = read_onnx(model_path).graph
    initializers = {i.name for i in graph.initializer}
    inputs = tuple(i.name for i in graph.input if i.name not in initializers)
    outputs = {o.name: o for o in graph.output}
    _check_inputs(model_path, inputs)
    output = _served_output(model_path, outputs, modules)
    pooling, normalize = _pooling(directory, model_path, output, modules, config, st)
    model_type = hf.str_or_empty("model_type")
    prompt = _default_prompt(st)
    max_seq_length = _max_seq_length(directory, hf, sbert, model_type, config)
    budget_set = "max_batch_tokens" in config.model_fields_set
    if budget_set and max_seq_length > config.max_batch_tokens:
        raise ModelLoadError(
            f"{directory}: max_seq_length {max_seq_length} exceeds embedding.max_batch_tokens "
            f"{config.max_batch_tokens}: raise max_batch_tokens in model.toml, or lower "
            "embedding.max_seq_length"
        )
    tokenizer = embedding_tokenizer(tokenizer_path, max_seq_length)
    return EmbeddingSpec(
        directory=directory,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        max_seq_length=max_seq_length,
        pooling=pooling,
        normalize=normalize,
        output=output,
        inputs=inputs,
        pad_token_id=_pad_token_id(hf, tokenizer),
        vocab_size=hf.int_or_none(("vocab_size",)) or tokenizer.get_vocab_size(),
        dimensions=_dimensions(outputs[output], len(pooling) or 1),
        prompt=prompt,
        model_type=model_type,
        lowercase=sbert.bool_or_none("do_lower_case") is True,
        max_token_chars=longest_token(tokenizer),
        tokenizer=tokenizer,
    )


def _pooling(
    directory: Path,
    model_path: Path,
    output: str,
    modules: list[tuple[str, str]],
    config: EmbeddingConfig,
    st: JsonFile,
) -> tuple[tuple[PoolingMode, ...], bool]:
    """The pooling modes (none when the graph pools) and whether vectors are normalised."""
    normalize = any(kind == _NORMALIZE for kind, _ in modules)
    if output == POOLED_OUTPUT:
        if config.pooling is not None:
            raise ModelLoadError(
                f"{model_path}: the graph pools ({POOLED_OUTPUT!r}); embedding.pooling "
                f"applies to a model that outputs {' or '.join(TOKEN_OUTPUTS)}"
            )
        return (), normalize
    pooling = (config.pooling,) if config.pooling else _pooling_modes(directory, modules, st)
    return pooling, normalize if config.normalize is None else config.normalize


def _read_modules(directory: Path) -> list[tuple[str, str]]:
    """modules.json's modules in order: (type's last name, path); [] when absent."""
    path = directory / MODULES_FILE
    if not path.exists():
        return []
    raw = read_regular_file(path, MAX_JSON_BYTES, ModelLoadError, "a JSON file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ModelLoadError(f"{path}: expected a list of modules (objects)")
    modules = []
    for module in data:
        kind, where = module.get("type"), module.get("path", "")
        if not isinstance(kind, str) or not isinstance(where, str):
            raise ModelLoadError(f"{path}: each module needs a type and a path, got {module}")
        parts = PurePosixPath(where).parts
        if where.startswith(("/", "\\")) or ".." in parts:
            raise ModelLoadError(f"{path}: module path {where!r} leads outside the folder")
        modules.append((kind.removeprefix(_MODULE_PREFIX), where))
    return modules


def _check_inputs(model_path: Path, inputs: tuple[str, ...]) -> None:
    unknown = [name for name in inputs if name not in _KNOWN_INPUTS]
    if unknown:
        raise ModelLoadError(
            f"{model_path}: input(s) {unknown} are not a text encoder's; an embedding model "
            f"takes {', '.join(_KNOWN_INPUTS[:3])} (and perhaps position_ids)"
        )
    missing = [n for n in (INPUT_IDS, ATTENTION_MASK) if n not in inputs]
    if missing:
        raise ModelLoadError(
            f"{model_path}: an embedding model needs the inputs input_ids and attention_mask "
            f"(texts of different lengths run together, padded and masked); it lacks {missing}"
        )


def _served_output(
    model_path: Path, outputs: dict[str, Any], modules: list[tuple[str, str]]
) -> str:
    """The pipeline's vector when the graph has it; else per-token vectors, when nothing
    but pooling and normalisation follows the transformer."""
    if POOLED_OUTPUT in outputs:
        return POOLED_OUTPUT
    token = next((name for name in TOKEN_OUTPUTS if name in outputs), None)
    if token is None:
        raise ModelLoadError(
            f"{model_path}: the model has no output {' or '.join((POOLED_OUTPUT, *TOKEN_OUTPUTS))}"
            f" (it has {sorted(outputs)}): export it with Optimum's feature-extraction task, "
            "or with --library-name sentence_transformers"
        )
    others = [kind for kind, _ in modules if kind not in (_TRANSFORMER, _POOLING, _NORMALIZE)]
    if others:
        raise ModelLoadError(
            f"{model_path}: modules.json runs {others} after pooling, which the graph (the "
            f"transformer alone, {token!r}) does not hold: export the whole pipeline with "
            "`optimum-cli export onnx --library-name sentence_transformers`, whose "
            f"{POOLED_OUTPUT!r} output includes them"
        )
    if modules and _POOLING not in (kind for kind, _ in modules):
        raise ModelLoadError(
            f"{model_path.parent}: modules.json has no Pooling module; set embedding.pooling "
            "in model.toml"
        )
    return token


def _pooling_modes(
    directory: Path, modules: list[tuple[str, str]], st: JsonFile
) -> tuple[PoolingMode, ...]:
    where = next((path for kind, path in modules if kind == _POOLING), None)
    if where is None:
        raise ModelLoadError(
            f"{directory}: no modules.json names a Pooling module; set embedding.pooling in "
            "model.toml"
        )
    pooling = JsonFile.read(directory / where / "config.json", required=True)
    modes = tuple(
        mode for mode in POOLING_MODES if pooling.bool_or_none(_FLAG_OF_MODE[mode]) is True
    )
    if not modes:
        raise ModelLoadError(f"{pooling.path}: no pooling_mode_* flag is true")
    has_prompt = bool(st.str_or_empty("default_prompt_name"))
    if pooling.bool_or_none("include_prompt") is False and has_prompt:
        raise ModelLoadError(
            f"{pooling.path}: include_prompt = false (the default prompt's tokens left out of "
            "the pooling) is not served"
        )
    return modes


def _default_prompt(st: JsonFile) -> str:
    """The prompt sentence-transformers' encode puts before every text by default
    (config_sentence_transformers.json's)."""
    name = st.str_or_empty("default_prompt_name")
    if not name:
        return ""
    prompts = st.data.get("prompts")
    if not isinstance(prompts, dict) or not isinstance(prompts.get(name), str):
        raise ModelLoadError(f"{st.path}: default_prompt_name {name!r} is not in its prompts")
    return str(prompts[name])


def _max_seq_length(
    directory: Path, hf: JsonFile, sbert: JsonFile, model_type: str, config: EmbeddingConfig
) -> int:
    """As sentence-transformers resolves it: sentence_bert_config.json's, else the least of
    the model's positions and tokenizer_config.json's model_max_length; model.toml's over
    both. More than the model's positions is refused (such a text could not run)."""
    positions = hf.int_or_none(("max_position_embeddings",))
    limit = None
    if positions is not None:
        limit = positions - 2 if model_type in _OFFSET_POSITIONS else positions
    if config.max_seq_length is not None:
        length = config.max_seq_length
    else:
        found = sbert.int_or_none(("max_seq_length",))
        if found is None:
            tok = JsonFile.read(directory / "tokenizer_config.json")
            value = tok.data.get("model_max_length")
            sane = isinstance(value, int) and 0 < value < _MAX_SANE_LENGTH
            candidates = [v for v in (positions, value if sane else None) if v is not None]
            found = min(candidates) if candidates else None
            if found is not None and limit is not None:
                found = min(found, limit)
        if found is None:
            raise ModelLoadError(
                f"{directory}: no max_seq_length (sentence_bert_config.json) and no "
                "max_position_embeddings (config.json): set embedding.max_seq_length"
            )
        length = int(found)
    if limit is not None and length > limit:
        raise ModelLoadError(
            f"{directory}: max_seq_length {length} exceeds the {limit} positions the model has "
            f"(config.json max_position_embeddings {positions}): set embedding.max_seq_length"
        )
    return length


def _pad_token_id(hf: JsonFile, tokenizer: Tokenizer) -> int:
    """What padding fills input_ids with (masked out; RoBERTa-like models also number
    positions by it)."""
    value = hf.int_or_none(("pad_token_id",), minimum=0)
    if value is not None:
        return value
    for text in ("[PAD]", "<pad>", "<|pad|>"):
        found = tokenizer.token_to_id(text)
        if found is not None:
            return int(found)
    return 0


def _dimensions(output: Any, modes: int) -> int:
    """The vector's length from the output's last dimension when the graph fixes it."""
    dims = output.type.tensor_type.shape.dim
    if not dims or not dims[-1].HasField("dim_value"):
        return 0
    return int(dims[-1].dim_value) * modes
