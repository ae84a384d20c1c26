"""systemd/tensord.toml is the README's "every key with its default": it lists every key of
the configuration, with its default value, and marks exactly the restart-only keys."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from tensord.config import TensordConfig, env_keys
from tensord.server.reload import LIVE_KEYS, RESTART_ONLY_KEYS

EXAMPLE = Path(__file__).resolve().parents[3] / "systemd" / "tensord.toml"
# Set to where tensord.service keeps them instead of their defaults.
SERVICE_DIRECTORIES = {"model_repository", "cache_directory"}
KEY_LINE = re.compile(r"^(#\s*)?(\w+)\s*=")


def example_lines() -> dict[str, tuple[bool, bool]]:
    """Dotted key -> (commented out, marked [restart]), for each key line of the file."""
    table, found = "", {}
    for line in EXAMPLE.read_text().splitlines():
        header = re.match(r"^\[(\w+)\]", line)
        if header:
            table = header.group(1)
            continue
        match = KEY_LINE.match(line)
        if match:
            key = f"{table}.{match.group(2)}" if table else match.group(2)
            found[key] = (bool(match.group(1)), "[restart]" in line)
    return found


def default(key: str) -> Any:
    value: Any = TensordConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_every_key_is_listed_with_its_default() -> None:
    lines = example_lines()
    keys = set(env_keys().values())
    assert set(lines) == keys
    data = tomllib.loads(EXAMPLE.read_text())
    for key in sorted(keys - SERVICE_DIRECTORIES):
        commented, _ = lines[key]
        if default(key) is None:
            assert commented, f"{key} is unset by default: show it commented out"
            continue
        assert not commented, key
        table, _, leaf = key.rpartition(".")
        value = data[table][leaf] if table else data[leaf]
        assert value == default(key), key


def test_restart_markers_match_the_reload() -> None:
    marked = {key for key, (_, restart) in example_lines().items() if restart}
    assert marked == set(RESTART_ONLY_KEYS)


def test_every_key_is_either_live_or_restart_only() -> None:
    live, restart = set(LIVE_KEYS), set(RESTART_ONLY_KEYS)
    assert not live & restart
    assert live | restart == set(env_keys().values())
