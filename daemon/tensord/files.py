"""Files the daemon reads and writes: TOML with one clear message for each way it cannot be
read, and caches written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: Path, error: type[Exception], label: str = "") -> dict[str, Any]:
    """The file's tables; `error(message)` naming `label` (default: the path) otherwise."""
    where = label or str(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
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
