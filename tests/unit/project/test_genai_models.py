"""The tiny onnxruntime-genai builder folders (tests/genai_models.py): each family's folder
is whole, its genai_config.json says what its transformers config says, its sliding
windows are where transformers puts them, and its reference has the tokens asked for.

The first run on a host makes the genai venv (about 90 s; `make test` makes it before
pytest) and builds the folders (about 15 s); later runs take them from build/. A venv that
cannot be made fails these tests with pip's output: nothing is skipped.
"""

from __future__ import annotations

import onnxruntime as ort
import pytest

from tests.genai_models import FAMILIES, NEW_TOKENS, PROMPTS, BuiltModel, build_families

pytestmark = pytest.mark.timeout(900)

WINDOWS = {
    "mistral_sw16": (16, [0, 1]),
    "qwen2_sw8": (8, [1]),
    "gemma2": (8, [0]),
    "gemma3": (8, [0]),
}
"""The families with sliding-window layers: (window, the windowed layers)."""


@pytest.fixture(scope="module")
def built() -> dict[str, BuiltModel]:
    return build_families()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_folder_matches_the_transformers_config(built: dict[str, BuiltModel], name: str) -> None:
    model = built[name]
    for file in ("genai_config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json"):
        assert (model.path / file).is_file(), f"{name}: no {file} in {model.path}"
    hf = model.hf_config()
    decoder = model.genai_config()["model"]["decoder"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    assert decoder["num_hidden_layers"] == hf["num_hidden_layers"]
    assert decoder["num_key_value_heads"] == hf["num_key_value_heads"]
    assert decoder["head_size"] == head_dim
    assert model.genai_config()["model"]["context_length"] == hf["max_position_embeddings"]
    window = decoder.get("sliding_window")
    if name in WINDOWS:
        assert window is not None, f"{name}: the builder emitted no sliding window"
        assert (window["window_size"], window["layers"]) == WINDOWS[name]
    else:
        assert window is None


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.reference])
def test_reference_has_the_tokens_asked_for(built: dict[str, BuiltModel], name: str) -> None:
    runs = built[name].reference_runs()
    assert [run.prompt for run in runs] == list(PROMPTS)
    for run in runs:
        assert len(run.tokens) == len(run.top2_gaps) == NEW_TOKENS
        assert all(gap >= 0 for gap in run.top2_gaps)
        assert run.comparable > 0


def test_bf16_cuda_folder_is_refused_by_a_cpu_session(built: dict[str, BuiltModel]) -> None:
    """The CUDA-only folder: built for CUDA in bfloat16, no reference, and ONNX Runtime's
    CPU provider has no kernel for its bfloat16 MatMul."""
    model = built["llama_bf16_cuda"]
    assert model.reference is None
    options = model.genai_config()["model"]["decoder"]["session_options"]["provider_options"]
    assert [next(iter(o)) for o in options] == ["cuda"]
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*MatMul"):
        ort.InferenceSession(str(model.path / "model.onnx"), providers=["CPUExecutionProvider"])
