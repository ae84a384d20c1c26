"""An embedding folder's tokenizer as sentence-transformers' encode uses it."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tensord.errors import ModelLoadError
from tensord.generate.model.hf_config import JsonFile
from tensord.generate.model.model_dir import load_tokenizer


def embedding_tokenizer(path: Path, max_seq_length: int) -> Tokenizer:
    """The folder's tokenizer as sentence-transformers' encode uses it: special tokens
    added as transformers adds them, texts truncated at max_seq_length (an encoding that
    lost tokens keeps them in its `overflowing`), no padding."""
    tokenizer = load_tokenizer(path)
    apply_special_tokens(tokenizer, path.parent)
    tokenizer.enable_truncation(max_seq_length)
    return tokenizer


# transformers' fast tokenizers that rebuild tokenizer.json's post-processor when they load,
# from tokenizer_config.json's add_bos_token and add_eos_token (these defaults when unset):
# their update_post_processor.
_REBUILT_POST_PROCESSORS = {
    "LlamaTokenizer": (True, False),
    "CodeLlamaTokenizer": (True, False),
    "GemmaTokenizer": (True, False),
    "CohereTokenizer": (True, False),
    "GPTNeoXTokenizer": (False, False),
}


def apply_special_tokens(tokenizer: Tokenizer, directory: Path) -> None:
    """For a tokenizer class that transformers rebuilds the post-processor of (Llama,
    Gemma, ...), the same rebuild: BOS and EOS as tokenizer_config.json asks."""
    from tokenizers import processors

    config = JsonFile.read(directory / "tokenizer_config.json")
    name = config.str_or_empty("tokenizer_class").removesuffix("Fast")
    defaults = _REBUILT_POST_PROCESSORS.get(name)
    if defaults is None:
        return
    add_bos = config.bool_or_none("add_bos_token")
    add_eos = config.bool_or_none("add_eos_token")
    add_bos = defaults[0] if add_bos is None else add_bos
    add_eos = defaults[1] if add_eos is None else add_eos
    special, single, pair = [], "$A:0", "$B:1"
    for wanted, key in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if not wanted:
            continue
        text = config.token_text(key)
        token_id = None if text is None else tokenizer.token_to_id(text)
        if text is None or token_id is None:
            raise ModelLoadError(
                f"{config.path}: add_{key} is true but {key} is not in the vocabulary"
            )
        special.append((text, token_id))
        if key == "bos_token":
            single, pair = f"{text}:0 {single}", f"{text}:1 {pair}"
        else:
            single, pair = f"{single} {text}:0", f"{pair} {text}:1"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} {pair}", special_tokens=special
    )


def longest_token(tokenizer: Tokenizer) -> int:
    """The most characters a token of the vocabulary holds (its string as the vocabulary
    writes it, markers such as ## and byte-level stand-ins included: a bound)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)
