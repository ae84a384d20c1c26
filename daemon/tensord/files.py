"""Files the daemon reads and writes: TOML with one clear message for each way it cannot be
read, and caches written atomically."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

MAX_TOML_BYTES = 4 * 1024 * 1024
"""The largest configuration file read (the daemon's, a model.toml, the token file)."""
_MAX_NESTING = 64
"""Tables and arrays nested deeper than this are refused: no setting nests past a few
levels, and the TOML parser recurses once per level."""


def read_toml(path: Path, error: type[Exception], label: str = "") -> dict[str, Any]:
    """The file's tables; `error(message)` naming `label` (default: the path) otherwise.

    Only a regular file is opened for reading (a FIFO would block the reader until
    somebody writes to it), at most MAX_TOML_BYTES of it, nested at most 64 levels."""
    where = label or str(path)
    try:
        text = _read_regular(path, where, error).decode("utf-8")
        data = tomllib.loads(text)
    except IsADirectoryError:
        raise error(f"{where}: is a directory; expected a TOML file") from None
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(
            f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply (at most {_MAX_NESTING} levels)") from None
    if _depth(data) > _MAX_NESTING:
        raise error(f"{where}: nested too deeply (at most {_MAX_NESTING} levels)")
    return data


def _read_regular(path: Path, where: str, error: type[Exception]) -> bytes:
    """A regular file's bytes (opened without blocking, so a FIFO is refused, not waited
    on); `error` when it is something else or larger than MAX_TOML_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
            raise error(f"{where}: is {kind}; expected a TOML file")
        data = f.read(MAX_TOML_BYTES + 1)
    if len(data) > MAX_TOML_BYTES:
        raise error(f"{where}: is larger than {MAX_TOML_BYTES} bytes; expected a TOML file")
    return data


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
