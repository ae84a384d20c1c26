"""Real Hugging Face Optimum exports (GPT-2, Llama with grouped KV heads, external weights):
read unchanged, decoded with a KV cache exactly as without one, and served by the daemon's
generation engine (one test starts a real server on loopback) with the same tokens.

The models are tiny and random, built from configs here (nothing downloaded), with the demo's
tokenizer; transformers, optimum-onnx and torch come with the `export` extra that `make test`
installs. The demo graph itself is also checked against transformers' Llama on its weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tensord.demo.decoder_graph import DecoderShape, init_weights
from tensord.demo.generator import build_demo_generator
from tensord.demo.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, build_tokenizer
from tensord.generate.model.model_dir import load_generator_dir, read_generator_spec
from tests.generate_reference import ReferenceModel, benchmark_module
from tests.tools import require_module

generate_limit = benchmark_module("generate_limit")

# Exporting traces PyTorch code: its tracer and deprecation warnings are not about tensord.
pytestmark = pytest.mark.filterwarnings("ignore")

NEW_TOKENS = 16
PROMPTS = ["The quick brown fox", "Hello there, how are you", "1 2 3", "Once upon a time"]


torch = require_module("torch", "make setup (the export extra)")
transformers = require_module("transformers", "make setup (the export extra)")
optimum_onnx = require_module("optimum.exporters.onnx", "make setup (the export extra)")


def _export(model: Any, tokenizer: Any, root: Path, name: str) -> Path:
    source, out = root / f"{name}-pytorch", root / name
    model.eval()
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    optimum_onnx.main_export(
        str(source), output=str(out), task="text-generation-with-past", device="cpu"
    )
    return out


def _to_external_data(directory: Path) -> None:
    """Move the weights to model.onnx_data, as Optimum writes exports too big for one file."""
    path = directory / "model.onnx"
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx_data")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("optimum")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
    )
    vocab = tokenizer.vocab_size
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=vocab,
            n_positions=128,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=1,
            eos_token_id=2,
            initializer_range=0.2,
        )
    )
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            initializer_range=0.2,
        )
    )
    found = {
        "gpt2": _export(gpt2, tokenizer, root, "gpt2"),
        "llama": _export(llama, tokenizer, root, "llama"),
    }
    _to_external_data(found["llama"])
    return found


def test_gpt2_export_spec(exports: dict[str, Path]) -> None:
    spec = read_generator_spec(exports["gpt2"])
    assert (spec.model_type, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads) == (
        "gpt2",
        2,
        4,
        4,
    )
    assert (spec.head_dim, spec.hidden_size, spec.context_length, spec.vocab_size) == (
        16,
        64,
        128,
        2048,
    )
    assert set(spec.input_names) == {
        "input_ids",
        "attention_mask",
        "position_ids",
        *(name for pair in spec.past_input_names for name in pair),
    }
    assert (spec.eos_token_ids, spec.bos_token_id, spec.add_bos_token) == ((2,), 1, True)
    assert spec.external_data_paths == ()


def test_llama_export_with_grouped_kv_and_external_data(exports: dict[str, Path]) -> None:
    directory = exports["llama"]
    spec = read_generator_spec(directory)
    assert (spec.model_type, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (
        "llama",
        4,
        2,
        16,
    )
    assert (spec.context_length, spec.pad_token_id) == (256, 0)
    assert spec.external_data_paths == ((directory / "model.onnx_data").resolve(),)
    assert (directory / "model.onnx").stat().st_size < 200_000


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_kv_cache_loop_equals_no_cache_reference(exports: dict[str, Path], name: str) -> None:
    loaded = load_generator_dir(exports[name])
    prompts = [loaded.encode_prompt(p) for p in PROMPTS]
    reference = ReferenceModel(exports[name])
    runs = [reference.greedy(p, NEW_TOKENS) for p in prompts]
    session = generate_limit.make_session(loaded.spec, intra_op_threads=1)
    batched = generate_limit.greedy_with_past(session, loaded.spec, prompts, NEW_TOKENS)
    compared = [run.check(tokens) for run, tokens in zip(runs, batched.tokens, strict=True)]
    for prompt, run in zip(prompts, runs, strict=True):
        alone = generate_limit.greedy_with_past(session, loaded.spec, [prompt], NEW_TOKENS)
        run.check(alone.tokens[0])
    # The comparison must cover real work: near ties are rare on these weights.
    assert sum(compared) >= 3 * NEW_TOKENS, compared
    assert len({run.tokens for run in runs}) == len(PROMPTS)


def test_demo_graph_matches_transformers_llama(tmp_path: Path) -> None:
    directory = build_demo_generator(tmp_path / "tinylm")
    spec = read_generator_spec(directory)
    config = transformers.LlamaConfig.from_pretrained(directory)
    model = transformers.LlamaForCausalLM(config).eval()
    weights = init_weights(DecoderShape(vocab_size=spec.vocab_size), seed=0)
    state = {name: torch.from_numpy(value) for name, value in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    ids = np.array([load_generator_dir(directory).encode_prompt("The quick brown fox jumps")])
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.numpy()
    reference = ReferenceModel(directory)
    feeds_logits = np.stack(
        [reference.last_logits(ids[0, : n + 1].tolist()) for n in range(ids.shape[1])]
    )
    np.testing.assert_allclose(feeds_logits, expected[0], atol=2e-4, rtol=1e-4)


def test_exports_served_by_the_daemon_equal_the_reference(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    """The exports as they are (plus a small KV pool), through a real server and the engine:
    every prompt's greedy stream equals the no-cache reference."""
    import shutil

    from tensord_client import Client
    from tests.conftest import serve

    for name, directory in exports.items():
        shutil.copytree(directory, tmp_path / name)
        (tmp_path / name / "model.toml").write_text("[generator]\nnum_blocks = 64\n")
    srv = serve(tmp_path)
    try:
        with Client(srv.target, timeout=60, retries=0) as client:
            kinds = {m.name: m.kind for m in client.info().models}
            assert kinds == {"gpt2": "generator", "llama": "generator"}
            for name, directory in exports.items():
                loaded = load_generator_dir(directory)
                reference = ReferenceModel(directory)
                compared = 0
                for text in PROMPTS:
                    chunks = list(
                        client.generate(
                            name, text, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True
                        )
                    )
                    tokens = [t for c in chunks for t in c.token_ids]
                    run = reference.greedy(loaded.encode_prompt(text), NEW_TOKENS)
                    compared += run.check(tokens)
                    assert chunks[-1].usage.prompt_tokens == len(run.prompt)
                assert compared >= 3 * NEW_TOKENS, (name, compared)
    finally:
        srv.stop()
