"""Reading generator directories: the demo's spec, other key spellings, and broken files."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from tensord.demo.decoder_graph import DecoderShape
from tensord.demo.generator import DemoGeneratorOptions, build_demo_generator
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.generate.model.hf_config import MAX_JSON_BYTES, FileDefaults
from tensord.generate.model.model_dir import (
    MAX_TOKENIZER_BYTES,
    is_generator_dir,
    load_generator_dir,
    read_generator_spec,
)

LAYER_NAMES = tuple(f"past_key_values.{i}.{kind}" for i in range(4) for kind in ("key", "value"))


@pytest.fixture(scope="module")
def tinylm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_generator(tmp_path_factory.mktemp("gen") / "tinylm")


def _copy(src: Path, dst: Path) -> Path:
    """A copy whose model.onnx is a link: the small files can be edited freely."""
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.name == "model.onnx":
            (dst / item.name).symlink_to(item)
        else:
            shutil.copy(item, dst / item.name)
    return dst


def _edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_demo_spec(tinylm: Path) -> None:
    spec = read_generator_spec(tinylm)
    assert (spec.model_type, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads) == (
        "llama",
        4,
        4,
        2,
    )
    assert (spec.head_dim, spec.hidden_size, spec.vocab_size, spec.context_length) == (
        64,
        256,
        2048,
        2048,
    )
    assert spec.kv_dtype is DType.FLOAT32
    assert spec.kv_bytes_per_token == 2 * 4 * 2 * 64 * 4
    assert spec.input_names == ("input_ids", "attention_mask", "position_ids", *LAYER_NAMES)
    assert spec.output_names[0] == "logits" and len(spec.output_names) == 9
    assert spec.past_input_names[3] == ("past_key_values.3.key", "past_key_values.3.value")
    assert spec.present_output_names[0] == ("present.0.key", "present.0.value")
    assert spec.has_position_ids
    assert (spec.eos_token_ids, spec.bos_token_id, spec.add_bos_token, spec.pad_token_id) == (
        (2,),
        1,
        True,
        0,
    )
    assert spec.defaults == FileDefaults(max_new_tokens=256)
    assert spec.external_data_paths == ()
    assert spec.generation_config_path == tinylm / "generation_config.json"
    assert is_generator_dir(tinylm)


def test_encode_prompt_adds_bos_once(tinylm: Path) -> None:
    loaded = load_generator_dir(tinylm)
    ids = loaded.encode_prompt("The quick brown fox")
    assert ids[0] == 1 and 1 not in ids[1:] and 2 not in ids
    assert loaded.tokenizer.decode(ids) == "The quick brown fox"


def test_external_data(tmp_path: Path) -> None:
    directory = build_demo_generator(
        tmp_path / "ext", DemoGeneratorOptions(DecoderShape(num_layers=1), external_data=True)
    )
    spec = read_generator_spec(directory)
    assert spec.external_data_paths == ((directory / "model.onnx_data").resolve(),)
    assert spec.num_layers == 1
    assert (directory / "model.onnx").stat().st_size < 100_000  # weights live outside
    (directory / "model.onnx_data").unlink()
    with pytest.raises(ModelLoadError, match=r"keeps its weights in 'model.onnx_data', but .*"):
        read_generator_spec(directory)


def test_gpt2_style_keys_and_no_tokenizer_config(tinylm: Path, tmp_path: Path) -> None:
    d = _copy(tinylm, tmp_path / "g")
    (d / "tokenizer_config.json").unlink()
    (d / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 0], "do_sample": True, "temperature": 0.7, "top_k": 40})
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 4,
                "n_head": 4,
                "n_embd": 256,
                "n_positions": 1024,
                "n_ctx": 1024,
                "vocab_size": 2048,
                "bos_token_id": 1,
                "eos_token_id": 1,
            }
        )
    )
    spec = read_generator_spec(d)
    # KV heads come from the graph when config.json does not say; head_dim from n_embd/n_head.
    assert (spec.num_kv_heads, spec.head_dim, spec.context_length) == (2, 64, 1024)
    assert spec.eos_token_ids == (2, 0)  # generation_config.json wins over config.json
    # No tokenizer_config.json: tokenizer.json's post-processor adds <s>, so prompts start with it.
    assert (spec.bos_token_id, spec.add_bos_token, spec.pad_token_id) == (1, True, None)
    assert spec.defaults == FileDefaults(do_sample=True, temperature=0.7, top_k=40)


def test_config_spellings_as_transformers_reads_them(tinylm: Path, tmp_path: Path) -> None:
    """MPT's n_heads, n_layers, d_model and max_seq_len; no context length at all (BLOOM)."""
    d = _copy(tinylm, tmp_path / "mpt")
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mpt",
                "n_layers": 4,
                "n_heads": 4,
                "d_model": 256,
                "max_seq_len": 512,
                "vocab_size": 2048,
                "attn_config": {"alibi": True, "kv_n_heads": 2},
            }
        )
    )
    spec = read_generator_spec(d)
    assert (spec.num_layers, spec.num_attention_heads, spec.hidden_size) == (4, 4, 256)
    assert (spec.head_dim, spec.context_length, spec.notes) == (64, 512, ())
    _edit_json(d / "config.json", lambda c: c.pop("max_seq_len"))
    spec = read_generator_spec(d)
    assert spec.context_length is None
    assert spec.notes == (
        "config.json gives no context length (max_position_embeddings, n_positions, "
        "max_seq_len, seq_length, ...): max_model_len is [generator] max_model_len in "
        "model.toml, else the default",
    )


@pytest.mark.parametrize(
    ("change", "note"),
    [
        (
            {"num_key_value_heads": 4},
            "config.json gives KV heads 4, but the past_key_values inputs of model.onnx have "
            "KV heads 2; using 2",
        ),
        # Falcon's multi_query means one KV head, whatever num_kv_heads says.
        (
            {"num_key_value_heads": None, "num_kv_heads": 4, "multi_query": True},
            "config.json gives KV heads 1, but the past_key_values inputs of model.onnx have "
            "KV heads 2; using 2",
        ),
        (
            {"head_dim": 32},
            "config.json gives head size 32, but the past_key_values inputs of model.onnx "
            "have head size 64; using 64",
        ),
    ],
)
def test_the_graph_wins_over_config_and_says_so(
    tinylm: Path, tmp_path: Path, change: dict[str, Any], note: str
) -> None:
    d = _copy(tinylm, tmp_path / "g")
    _edit_json(d / "config.json", lambda c: c.update(change))
    spec = read_generator_spec(d)
    assert (spec.num_kv_heads, spec.head_dim, spec.notes) == (2, 64, (note,))


def test_keys_and_values_of_different_sizes_are_refused(tinylm: Path, tmp_path: Path) -> None:
    """Multi-head latent attention (DeepSeek-V3): keys 24 wide, values 16."""
    d = _copy(tinylm, tmp_path / "mla")
    _edit_json(
        d / "config.json",
        lambda c: c.update(qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    )
    model = onnx.load(str(d / "model.onnx"))
    for value in model.graph.input:
        if value.name.startswith("past_key_values") and value.name.endswith(".key"):
            value.type.tensor_type.shape.dim[3].dim_param = "key_dim"
    (d / "model.onnx").unlink()
    onnx.save(model, str(d / "model.onnx"))
    with pytest.raises(
        ModelLoadError,
        match=r"model.onnx: its keys have head size 24 and its values 16 \(multi-head latent "
        r"attention, as DeepSeek-V3 exports it\); tensord's paged KV cache holds keys and "
        r"values of one head size, so Generate cannot serve it",
    ):
        read_generator_spec(d)


def test_bos_from_tokenizer_config_text(tinylm: Path, tmp_path: Path) -> None:
    d = _copy(tinylm, tmp_path / "g")
    _edit_json(
        d / "tokenizer_config.json",
        lambda c: c.update(bos_token={"content": "</s>", "lstrip": False}, add_bos_token=False),
    )
    loaded = load_generator_dir(d)
    assert (loaded.spec.bos_token_id, loaded.spec.add_bos_token) == (2, False)
    assert loaded.encode_prompt("Hello")[0] != 2


def _no_past_graph(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["logits"])],
        "nopast",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "t"])],
    )
    path.unlink()
    onnx.save(helper.make_model(graph), str(path))


BROKEN: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "no tokenizer",
        lambda d: (d / "tokenizer.json").unlink(),
        r"a generator directory holds model.onnx, tokenizer.json and config.json \(an "
        r"Optimum export\) or genai_config.json \(a model-builder folder\); tokenizer.json "
        r"is missing",
    ),
    (
        "config not json",
        lambda d: (d / "config.json").write_text("{nope"),
        r"config.json: not valid JSON",
    ),
    (
        "config a list",
        lambda d: (d / "config.json").write_text("[1]"),
        r"config.json: expected a JSON object, got list",
    ),
    (
        "no heads",
        lambda d: _edit_json(d / "config.json", lambda c: c.pop("num_attention_heads")),
        r"config.json: num_attention_heads \(or n_head, n_heads, num_heads\) is missing",
    ),
    (
        "layers disagree",
        lambda d: _edit_json(d / "config.json", lambda c: c.update(num_hidden_layers=3)),
        r"config.json: num_hidden_layers is 3, but .*model.onnx has past_key_values for 4 layers",
    ),
    (
        "bad heads type",
        lambda d: _edit_json(d / "config.json", lambda c: c.update(num_attention_heads="4")),
        r"config.json: num_attention_heads must be an integer >= 1, got '4'",
    ),
    (
        "eos out of range",
        lambda d: _edit_json(
            d / "generation_config.json", lambda c: c.update(eos_token_id=[2, 9999])
        ),
        r"generation_config.json: eos_token_id must be a token id or a list of ids in \[0, 2048\)",
    ),
    (
        "top_p too big",
        lambda d: _edit_json(d / "generation_config.json", lambda c: c.update(top_p=1.5)),
        r"generation_config.json: top_p must be a number in \[0.0, 1.0\], got 1.5",
    ),
    (
        "do_sample not bool",
        lambda d: _edit_json(d / "generation_config.json", lambda c: c.update(do_sample="yes")),
        r"generation_config.json: do_sample must be true or false",
    ),
    (
        "unknown bos",
        lambda d: _edit_json(d / "tokenizer_config.json", lambda c: c.update(bos_token="<bos>")),
        r"tokenizer_config.json: bos_token '<bos>' is not a token of tokenizer.json",
    ),
    (
        "tokenizer broken",
        lambda d: (d / "tokenizer.json").write_text("{}"),
        r"tokenizer.json: the tokenizers library cannot read it",
    ),
    (
        "model not onnx",
        lambda d: ((d / "model.onnx").unlink(), (d / "model.onnx").write_bytes(b"garbage")),
        r"model.onnx: not a readable ONNX model",
    ),
    (
        "exported without past",
        lambda d: _no_past_graph(d / "model.onnx"),
        r"model.onnx: the graph has no past_key_values inputs: it was exported without a KV cache",
    ),
]


@pytest.mark.parametrize(("case", "breaks", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_directories(
    tinylm: Path, tmp_path: Path, case: str, breaks: Callable[[Path], None], message: str
) -> None:
    d = _copy(tinylm, tmp_path / "g")
    breaks(d)
    with pytest.raises(ModelLoadError, match=message):
        load_generator_dir(d)


TOKENIZER_BOUND = (
    "a tokenizer.json of at most 128 MiB (the largest vocabularies take a few tens of MB)"
)
JSON_BOUND = "a JSON file of at most 16 MiB"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("config.json", JSON_BOUND),
        ("generation_config.json", JSON_BOUND),
        ("tokenizer_config.json", JSON_BOUND),
        ("tokenizer.json", TOKENIZER_BOUND),
    ],
)
def test_a_fifo_or_an_oversized_json_file_is_refused(
    tinylm: Path, tmp_path: Path, name: str, expected: str
) -> None:
    """Each JSON file is read only as a regular file within its bound: a FIFO would block
    the load (and a reload after it) until somebody writes to it."""
    fifo = _copy(tinylm, tmp_path / "fifo")
    (fifo / name).unlink(missing_ok=True)
    os.mkfifo(fifo / name)
    with pytest.raises(ModelLoadError) as info:
        load_generator_dir(fifo)
    assert str(info.value) == f"{fifo / name}: is a FIFO; expected {expected}"
    large = _copy(tinylm, tmp_path / "large")
    limit = MAX_TOKENIZER_BYTES if name == "tokenizer.json" else MAX_JSON_BYTES
    with open(large / name, "ab") as f:  # sparse: nothing is written
        f.truncate(limit + 1)
    with pytest.raises(ModelLoadError) as info:
        load_generator_dir(large)
    assert str(info.value) == f"{large / name}: is larger than {limit} bytes; expected {expected}"


def test_a_long_text_is_tokenised_without_holding_the_gil(demo_repo: Path) -> None:
    """Tokenizer.encode holds the GIL for the whole text (seconds for megabytes: the event
    loop, Health included, waits); encode_text lets it go, with the same ids."""
    import asyncio
    import time

    from tokenizers import Tokenizer

    from tensord.dataplane.plane import off_loop
    from tensord.generate.model.model_dir import encode_text

    tokenizer = Tokenizer.from_file(str(demo_repo / "tinylm" / "tokenizer.json"))
    text = "a" * 2_000_000 + " the quick brown fox" * 1000

    async def tokenise_and_watch() -> tuple[list[int], float, float]:
        worst, done = 0.0, False

        async def lag() -> None:
            nonlocal worst
            while not done:
                start = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, time.perf_counter() - start)

        watcher = asyncio.create_task(lag())
        await asyncio.sleep(0.02)
        start = time.perf_counter()
        ids = await off_loop(text, lambda t: encode_text(tokenizer, t))
        took = time.perf_counter() - start
        done = True
        await watcher
        return ids, took, worst

    ids, took, worst = asyncio.run(tokenise_and_watch())
    assert ids == tokenizer.encode(text, add_special_tokens=False).ids
    # Holding the GIL, the loop would wait the whole tokenisation (~2.5 s here).
    assert worst < max(0.3, took / 4), f"loop lag {worst:.2f} s while tokenising for {took:.2f} s"


def test_a_tokenizer_files_truncation_and_padding_never_apply(
    demo_repo: Path, tmp_path: Path
) -> None:
    """tokenizer.json may set truncation and padding; transformers' calls turn both off by
    default, and so does tensord: a prompt is never cut short or padded."""
    from tensord.generate.model.model_dir import encode_text, load_tokenizer

    spec = json.loads((demo_repo / "tinylm" / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst",
                          "stride": 0}  # fmt: skip
    spec["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of":
                       None, "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"}  # fmt: skip
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    text = "the quick brown fox jumps over the lazy dog " * 3
    plain = load_tokenizer(demo_repo / "tinylm" / "tokenizer.json")
    expected = plain.encode(text, add_special_tokens=False).ids
    assert len(expected) > 8
    tokenizer = load_tokenizer(path)
    assert encode_text(tokenizer, text) == expected
    assert (
        encode_text(tokenizer, text * 100) == plain.encode(text * 100, add_special_tokens=False).ids
    )
