"""Reading a TOML file, with one clear message for each way it cannot be read."""

from __future__ import annotations

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
