"""Configuration files that could take the daemon down are refused, naming the file: deep
nesting, a FIFO, an oversized file, a boolean for a number, numbers gRPC cannot take. The
daemon's config, model.toml and the token file go through the same reader."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tensord.config import load_config
from tensord.config_tables import AuthSettings
from tensord.errors import ConfigError, ModelLoadError
from tensord.files import MAX_TOML_BYTES, read_toml
from tensord.modelconfig.model import read_model_config
from tensord.server.auth import read_token_file

NESTED_ARRAYS = "a = " + "[" * 3000 + "]" * 3000 + "\n"
NESTED_TABLES = "[" + ".".join(f"t{i}" for i in range(3000)) + "]\nx = 1\n"


READERS = {
    "config": ("tensord.toml", ConfigError, lambda p: load_config(p, env={})),
    "model.toml": ("model.toml", ModelLoadError, lambda p: read_model_config(p.parent)),
    "token file": ("tokens.toml", ConfigError, lambda p: read_token_file(p, AuthSettings())),
}


def _refused(tmp_path: Path, reader: str, make: object) -> str:
    """What reading a file made by `make(path)` with `reader` is refused with."""
    name, error, read = READERS[reader]
    path = tmp_path / name
    make(path)  # type: ignore[operator]
    with pytest.raises(error) as info:
        read(path)
    return str(info.value)


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("text", [NESTED_ARRAYS, NESTED_TABLES], ids=["arrays", "tables"])
def test_deep_nesting_is_refused_naming_the_file(tmp_path: Path, reader: str, text: str) -> None:
    message = _refused(tmp_path, reader, lambda p: p.write_text(text))
    assert message.endswith(f"{READERS[reader][0]}: line 1: {TOO_DEEP}")


TOO_DEEP = (
    "nested too deeply (at most 64 levels; the parts of a dotted key, the table header above "
    "it and the arrays and inline tables around it all count)"
)
LONG_KEY = "a." * 40_000 + "b"
"""A key of 40 001 parts (80 KB): the TOML parser alone takes over ten seconds on it."""


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"{LONG_KEY} = 1\n", 1),
        (f"x = 1\n[{LONG_KEY}]\n", 2),
        (f"[[{LONG_KEY}]]\n", 1),
        (f"x = {{ {LONG_KEY} = 1 }}\n", 1),
        ("[" + ".".join(["t"] * 40) + "]\n\n" + ".".join(["k"] * 30) + " = 1\n", 3),
        ("x = [\n  1, # ] }\n  {" + "a." * 70 + "b = 2},\n]\n", 3),
    ],
    ids=["dotted key", "table header", "array of tables", "inline table", "header+key", "array"],
)
def test_keys_nested_too_deeply_are_refused_at_their_line_before_parsing(
    tmp_path: Path, reader: str, text: str, line: int
) -> None:
    start = time.perf_counter()
    message = _refused(tmp_path, reader, lambda p: p.write_text(text))
    took = time.perf_counter() - start
    assert message.endswith(f"{READERS[reader][0]}: line {line}: {TOO_DEEP}")
    assert took < 2.0, took


def test_nesting_up_to_the_limit_is_read(tmp_path: Path) -> None:
    """64 levels are fine, and dots in strings and comments are no key's."""
    path = tmp_path / "deep.toml"
    header = "[" + ".".join(["t"] * 63) + "]"
    path.write_text(
        f"{'.'.join(['k'] * 64)} = 1\n{header}\n"
        f'x = "{"a." * 100}"  # {"." * 100}\n'
        f"y = '''\n{'[a.' * 100}\n'''\n"
    )
    data = read_toml(path, ConfigError)
    table: Any = data
    for _ in range(63):
        table = table["t"]
    assert table == {"x": "a." * 100, "y": "[a." * 100 + "\n"}
    value: Any = data
    for _ in range(64):
        value = value["k"]
    assert value == 1


@pytest.mark.parametrize("reader", list(READERS))
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, reader: str) -> None:
    message = _refused(tmp_path, reader, os.mkfifo)
    assert message.endswith(f"{READERS[reader][0]}: is a FIFO; expected a TOML file")


@pytest.mark.parametrize("reader", list(READERS))
def test_an_oversized_file_is_refused(tmp_path: Path, reader: str) -> None:
    padding = "# padding\n" * (MAX_TOML_BYTES // 10 + 1)
    message = _refused(tmp_path, reader, lambda p: p.write_text(padding))
    assert message.endswith(f": is larger than {MAX_TOML_BYTES} bytes; expected a TOML file")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("instance_count = true\n", "instance_count"),
        ("max_batch_size = false\n", "max_batch_size"),
        ("[dynamic_batching]\nmax_queue_delay_microseconds = true\n", "dynamic_batching"),
        ("[generator]\nnum_blocks = true\n", "generator.num_blocks"),
        ("[generator]\nstream_interval = true\n", "generator.stream_interval"),
    ],
)
def test_a_boolean_is_not_a_number_in_model_toml(tmp_path: Path, text: str, key: str) -> None:
    (tmp_path / "model.toml").write_text(text)
    with pytest.raises(ModelLoadError) as info:
        read_model_config(tmp_path)
    assert key in str(info.value) and "expected a number, got the boolean" in str(info.value)


@pytest.mark.parametrize(
    "line",
    [
        "max_receive_message_bytes = 2147483648",
        "max_send_message_bytes = 9223372036854775807",
        "max_concurrent_streams = 1099511627776",
    ],
)
def test_numbers_grpc_cannot_take_are_refused(tmp_path: Path, line: str) -> None:
    path = tmp_path / "tensord.toml"
    path.write_text(f"[server]\n{line}\n")
    key = line.split()[0]
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert f"server.{key}: expected a value less than or equal to 2147483647" in message
    assert str(path) in message


def test_a_boolean_is_not_a_number_in_the_daemon_config(tmp_path: Path) -> None:
    path = tmp_path / "tensord.toml"
    path.write_text("[limits]\nmax_prompt_tokens = true\n")
    with pytest.raises(ConfigError, match=r"limits.max_prompt_tokens: .*got the boolean true"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "instance_count = 1099511627776\n",
            "instance_count: expected a value less than or equal to 256",
        ),
        (
            "intra_op_threads = 4294967296\n",
            "intra_op_threads: expected a value less than or equal to 1024",
        ),
        (
            "[generator]\nnum_blocks = 4294967296\n",
            "generator.num_blocks: expected a value less than",
        ),
    ],
)
def test_numbers_past_what_the_runtimes_take_are_refused(
    tmp_path: Path, text: str, words: str
) -> None:
    (tmp_path / "model.toml").write_text(text)
    with pytest.raises(ModelLoadError) as info:
        read_model_config(tmp_path)
    assert words in str(info.value)
