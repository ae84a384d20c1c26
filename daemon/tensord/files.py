"""Files the daemon reads and writes: TOML and other files of bounded size, with one clear
message for each way they cannot be read, and caches written atomically."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from tensord.toml_nesting import find_too_deep

MAX_TOML_BYTES = 4 * 1024 * 1024
"""The largest configuration file read (the daemon's, a model.toml, the token file)."""
_MAX_NESTING = 64
"""Tables and arrays nested deeper than this are refused: no setting nests past a few
levels, and the TOML parser recurses once per level."""


def read_toml(path: Path, error: type[Exception], label: str = "") -> dict[str, Any]:
    """The file's tables; `error(message)` naming `label` (default: the path) otherwise.

    Only a regular file is opened for reading (a FIFO would block the reader until
    somebody writes to it), at most MAX_TOML_BYTES of it, nested at most 64 levels: text
    that nests deeper is refused, at its line, before the parser reads it (the parser takes
    time quadratic in the parts of a dotted key)."""
    where = label or str(path)
    data = read_regular_file(path, MAX_TOML_BYTES, error, "a TOML file", label)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are UTF-8"
        ) from None
    too_deep = find_too_deep(text, _MAX_NESTING)
    if too_deep is not None:
        raise error(
            f"{where}: line {too_deep.line}: nested too deeply (at most {_MAX_NESTING} levels; "
            "the parts of a dotted key, the table header above it and the arrays and inline "
            "tables around it all count)"
        )
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply (at most {_MAX_NESTING} levels)") from None
    if _depth(parsed) > _MAX_NESTING:
        raise error(f"{where}: nested too deeply (at most {_MAX_NESTING} levels)")
    return parsed


def read_regular_file(
    path: Path, max_bytes: int, error: type[Exception], expected: str, label: str = ""
) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `max_bytes`.

    It is opened without blocking, so a FIFO is refused rather than waited on (it would
    hold the reader, a reload say, until somebody writes to it). Anything else than a
    regular file, a larger file, or one that cannot be read raises `error(message)`, the
    message naming `label` (default: the path) and what was `expected` ("a TOML file")."""
    where = label or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise error(f"{where}: is a directory; expected {expected}") from None
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{where}: is a directory; expected {expected}")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
            raise error(f"{where}: is {kind}; expected {expected}")
        if info.st_size > max_bytes:
            raise _too_large(where, max_bytes, expected, error)
        with open(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew since fstat
        raise _too_large(where, max_bytes, expected, error)
    return data


def _too_large(where: str, max_bytes: int, expected: str, error: type[Exception]) -> Exception:
    return error(f"{where}: is larger than {max_bytes} bytes; expected {expected}")


def _depth(value: Any) -> int:
    """How deeply tables and arrays nest in `value` (iterative: the value may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > _MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` through a temporary file of its own beside `path`, then rename: a
    concurrent reader sees all of it or none, and concurrent writers never share a
    temporary file. OSError when it cannot be written (the temporary file is removed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
