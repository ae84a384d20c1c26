"""The files a model version's directory must hold beside its model file, by kind, and
the rule every file a load reads follows: a regular file inside the model's directory
(symlinks leading out of it only with follow_model_symlinks)."""

from __future__ import annotations

from pathlib import Path

from tensord.generate.model.genai_config import GENAI_CONFIG_FILE

# Beside the model file, tokenizer.json and one of the configs make a directory a generator
# (tensord.generate.model.model_dir): config.json for an Optimum export, genai_config.json for
# an ONNX Runtime GenAI model-builder folder.
GENERATOR_MARKERS = ("tokenizer.json",)
GENERATOR_CONFIGS = ("config.json", GENAI_CONFIG_FILE)
GENERATOR_OPTIONAL_FILES = ("generation_config.json", "tokenizer_config.json")
"""Read when present; like the markers, they follow the model file's symlink rule."""


def model_file_problem(path: Path, model_dir: Path, follow_symlinks: bool) -> str:
    """Why `path` cannot be served ("" when it can): missing, not a regular file, or led
    outside the model's directory by symlinks (the path it leads to quoted, as repr()
    quotes it: it may hold spaces, and redaction replaces it whole)."""
    if not path.exists():
        return f"{path} does not exist"
    real = path.resolve()
    if not follow_symlinks and not real.is_relative_to(model_dir.resolve()):
        return (
            f"{path} leads to {str(real)!r}, outside the model's directory {model_dir}; move the "
            "file in, or set follow_model_symlinks = true in the daemon's config"
        )
    if not real.is_file():
        return f"{path} is not a regular file"
    return ""


def generator_problem(
    directory: Path, model_file: str, model_dir: Path, follow_symlinks: bool
) -> str:
    """Why a generator's files cannot be served ("" when they can): a marker is missing,
    or one of its files is not a regular file or symlinks lead it outside the model's
    directory (as for the model file)."""
    missing = [n for n in GENERATOR_MARKERS if not (directory / n).exists()]
    configs = [n for n in GENERATOR_CONFIGS if (directory / n).exists()]
    if not configs:
        missing.append(" or ".join(GENERATOR_CONFIGS))
    if missing:
        return (
            f"{directory}: a generator needs tokenizer.json and config.json (an Optimum "
            f"export) or genai_config.json (a model-builder folder) beside {model_file}; "
            f"{', '.join(missing)} is missing"
        )
    present = [n for n in GENERATOR_OPTIONAL_FILES if (directory / n).exists()]
    for name in (*GENERATOR_MARKERS, *configs, *present):
        problem = model_file_problem(directory / name, model_dir, follow_symlinks)
        if problem:
            return problem
    return ""


_EMBEDDING_FILES = (
    "tokenizer.json",
    "config.json",
    "tokenizer_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
"""What loading an embedding folder reads besides its model file (when present)."""


def embedding_problem(directory: Path, model_dir: Path, follow_symlinks: bool) -> str:
    """Why an embedding folder's files cannot be served ("" when they can): tokenizer.json
    missing, or a file it reads not a regular file, or led outside the model's directory by
    symlinks (as a model file: follow_model_symlinks lets them)."""
    if not (directory / "tokenizer.json").exists():
        return f"{directory}: an embedding model needs tokenizer.json beside its files"
    for name in _EMBEDDING_FILES:
        path = directory / name
        if path.exists() or path.is_symlink():
            problem = model_file_problem(path, model_dir, follow_symlinks)
            if problem:
                return problem
    return ""
