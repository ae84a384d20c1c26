"""Tiny random-weight sentence-transformers models, saved as the Hugging Face Hub has them.

`build_st_folder` makes a BERT or MPNet encoder (hidden 64, two layers, four heads, seeded
random weights) with a WordPiece tokenizer written here, wraps it as a SentenceTransformer
(Transformer, Pooling and optionally Normalize) and saves it, then adds ONNX in one of two
layouts:

- "hub": the folder as `SentenceTransformer.save()` wrote it, plus `onnx/model.onnx`, an
  Optimum "feature-extraction" export of the transformer alone (inputs input_ids,
  attention_mask and, for BERT, token_type_ids; output last_hidden_state), as the Hub's
  sentence-transformers repositories carry it.
- "optimum": the output directory of `optimum-cli export onnx --library-name
  sentence_transformers --task feature-extraction`: model.onnx (inputs input_ids and
  attention_mask; outputs token_embeddings and sentence_embedding), config.json and the
  tokenizer files, but no modules.json nor 1_Pooling. The SentenceTransformer folder it was
  exported from is kept beside it (`<name>.st-source`), where `st_encode` finds it.

`st_encode` is the reference: sentence-transformers' own PyTorch encode of the folder.
Nothing is downloaded; torch, transformers, sentence-transformers and Optimum are imported
only when a function runs (tests that use this module skip without the export extra).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("bert", "mpnet")
LAYOUTS = ("hub", "optimum")
POOLINGS = ("mean", "cls", "lasttoken")

SOURCE_SUFFIX = ".st-source"
"""An "optimum" folder's SentenceTransformer source is the sibling named `<folder>.st-source`."""

OPSET = 18
"""The exports' ONNX opset: Optimum's default and recommended minimum for these models."""

MAX_POSITIONS = 512
"""The longest max_seq_length a folder may have (BERT's positions; MPNet gets 514)."""

_SPECIAL_TOKENS = {
    # BERT: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4.
    "bert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    # MPNet as microsoft/mpnet-base orders them: <s> 0, <pad> 1, </s> 2; pad id 1 matters, as
    # MPNet counts positions from input_ids != pad id.
    "mpnet": ("<s>", "<pad>", "</s>", "[UNK]", "<mask>"),
}

# Common English words (whitespace-separated; vocabulary() splits them).
_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children begin got
walk example ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain stop once
base hear horse cut sure watch color face wood main enough plain girl usual young ready above
ever red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit
power town fine certain fly fall lead cry dark machine note wait plan figure star box noun
field rest correct able pound done beauty drive stood contain front teach week final gave green
quick develop ocean warm free minute strong special mind behind clear tail produce fact street
inch multiply nothing course stay wheel full force blue object decide surface deep moon island
foot system busy test record boat common gold possible plane dry wonder laugh thousand ago ran
check game shape equate miss brought heat snow tire bring yes distant fill east paint language
among model search query document vector embedding cat sat mat quickly brown fox jumps lazy
"""

_SUFFIXES = ("s", "es", "ed", "ing", "ly", "er", "est", "tion", "ness", "ment", "able", "ful")
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def vocabulary(family: str) -> list[str]:
    """The WordPiece vocabulary: special tokens, single characters, "##" pieces (every
    character and common suffixes, so any ASCII word tokenizes without [UNK]), and words."""
    tokens = list(_SPECIAL_TOKENS[family])
    tokens += list(_SYMBOLS)
    tokens += [f"##{c}" for c in _SYMBOLS[:36]]
    tokens += [f"##{s}" for s in _SUFFIXES]
    tokens += [w for w in _WORDS.split() if len(w) > 1]
    return list(dict.fromkeys(tokens))


def folder_name(
    family: str, layout: str, pooling: str, normalize: bool, max_seq_length: int, matryoshka: bool
) -> str:
    """The subdirectory `build_st_folder` makes for these arguments."""
    name = f"{family}-{layout}-{pooling}-{'norm' if normalize else 'raw'}-len{max_seq_length}"
    return name + ("-mrl" if matryoshka else "")


def _tokenizer(family: str, work: Path) -> Any:
    """The family's fast tokenizer, converted from the vocabulary written under work."""
    import transformers

    vocab_file = work / "vocab.txt"
    vocab_file.write_text("\n".join(vocabulary(family)) + "\n", encoding="utf-8")
    cls = transformers.BertTokenizerFast if family == "bert" else transformers.MPNetTokenizerFast
    return cls(vocab_file=str(vocab_file), do_lower_case=True, model_max_length=MAX_POSITIONS)


SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
    },
    # all-MiniLM-L6-v2's shape, for benchmarks.
    "minilm": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
    },
}


def _model(family: str, vocab_size: int, pad_token_id: int, seed: int, size: str) -> Any:
    """The family's encoder with seeded random weights, in eval mode."""
    import torch
    import transformers

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        **SIZES[size],
        "initializer_range": 0.2,
        "pad_token_id": pad_token_id,
    }
    if family == "bert":
        config: Any = transformers.BertConfig(max_position_embeddings=MAX_POSITIONS, **common)
        model_class: Any = transformers.BertModel
    else:
        config = transformers.MPNetConfig(max_position_embeddings=MAX_POSITIONS + 2, **common)
        model_class = transformers.MPNetModel
    torch.manual_seed(seed)
    # BertModel keeps its pooler (seeded too), as BERT checkpoints do; sentence-transformers
    # and the exports leave its output unused.
    model = model_class(config).eval()
    # The init leaves biases at 0 and LayerNorm scales at 1, so every CLS vector would have
    # norm sqrt(hidden): random ones, as a trained model has, give each text its own norm.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)
            elif "LayerNorm" in name:
                param.normal_(1.0, 0.2)
    return model


def _save_st(
    folder: Path,
    family: str,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    seed: int,
    size: str = "tiny",
) -> None:
    """Build the SentenceTransformer and save it to folder (which must not exist yet)."""
    from sentence_transformers import SentenceTransformer, models

    with tempfile.TemporaryDirectory(prefix="st-hf-") as tmp:
        work = Path(tmp)
        tokenizer = _tokenizer(family, work)
        tokenizer.save_pretrained(work / "hf")
        model = _model(family, len(tokenizer), tokenizer.pad_token_id, seed, size)
        model.save_pretrained(work / "hf")
        transformer = models.Transformer(str(work / "hf"), max_seq_length=max_seq_length)
        modules: list[Any] = [
            transformer,
            models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling),
        ]
        if normalize:
            modules.append(models.Normalize())
        SentenceTransformer(modules=modules, device="cpu").save(
            str(folder), create_model_card=False
        )


def _export(source: Path, out: Path, library_name: str) -> None:
    """Optimum's feature-extraction export of source into out (no validation)."""
    from optimum.exporters.onnx import main_export

    main_export(
        str(source),
        output=str(out),
        task="feature-extraction",
        library_name=library_name,
        opset=OPSET,
        device="cpu",
        do_validation=False,
    )


def build_st_folder(
    root: Path,
    family: str,
    layout: str,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int = 64,
    matryoshka: bool = False,
    seed: int = 0,
    size: str = "tiny",
) -> Path:
    """Build the folder under root (a new subdirectory named after the arguments, see
    `folder_name`) and return it.

    matryoshka changes nothing in the folder (a Matryoshka model's files are those of any
    other: the daemon truncates to the first N dimensions); it only names the folder apart.
    `size` is a key of SIZES ("minilm": all-MiniLM-L6-v2's shape, for benchmarks).
    """
    if family not in FAMILIES or layout not in LAYOUTS or pooling not in POOLINGS:
        raise ValueError(f"unknown family, layout or pooling: {family}, {layout}, {pooling}")
    if not 0 < max_seq_length <= MAX_POSITIONS:
        raise ValueError(f"max_seq_length must be in 1..{MAX_POSITIONS}: {max_seq_length}")
    folder = root / folder_name(family, layout, pooling, normalize, max_seq_length, matryoshka)
    if folder.exists():
        raise FileExistsError(folder)
    root.mkdir(parents=True, exist_ok=True)
    # Building and tracing PyTorch code warns about things that are not tensord's concern.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if layout == "hub":
            _save_st(folder, family, pooling, normalize, max_seq_length, seed, size)
            with tempfile.TemporaryDirectory(prefix="st-onnx-") as tmp:
                _export(folder, Path(tmp), "transformers")
                (folder / "onnx").mkdir()
                for path in Path(tmp).glob("model.onnx*"):  # and model.onnx_data, if any
                    shutil.move(path, folder / "onnx" / path.name)
        else:
            source = folder.with_name(folder.name + SOURCE_SUFFIX)
            if source.exists():
                raise FileExistsError(source)
            _save_st(source, family, pooling, normalize, max_seq_length, seed, size)
            _export(source, folder, "sentence_transformers")
    return folder


def st_source(folder: Path) -> Path:
    """The SentenceTransformer folder behind folder: itself, or for an "optimum" export
    (which has no modules.json) the source it was exported from."""
    if (folder / "modules.json").is_file():
        return folder
    source = folder.with_name(folder.name + SOURCE_SUFFIX)
    if (source / "modules.json").is_file():
        return source
    raise FileNotFoundError(f"{folder} is no sentence-transformers folder and has no source")


def st_encode(folder: Path, texts: list[str], *, batch_size: int = 32) -> np.ndarray:
    """sentence-transformers' PyTorch reference: SentenceTransformer(folder, device="cpu")
    .encode(texts), float32 [len(texts), dim] (normalised when the folder has Normalize)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_source(folder)), device="cpu")
    vectors = model.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)
