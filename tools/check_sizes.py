"""Size limits `make lint` holds on the daemon and the client library: a module of at most
MAX_FILE_LINES lines, a function or method of at most MAX_FUNCTION_LINES (its `def` line
to its last, decorators left out). protoc's modules (*_pb2*) are left out.

    python tools/check_sizes.py [--root DIR] [--allowlist FILE]

One over its limit fails the check unless the allow-list (tools/size_allowlist.toml) names
it, with a one-line reason, in its [allow] table: "PATH" for a module, "PATH:QUALNAME" for
a function ("daemon/tensord/x.py:Class.method", nested ones as "outer.inner"), PATH
relative to the root. An entry that names nothing over its limit fails the check too, so
the list only ever shrinks.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = Path("tools") / "size_allowlist.toml"
SOURCES = ("daemon", "clients/python/tensord_client")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Oversize:
    """A module or a function over its limit."""

    key: str
    """How the allow-list names it: "PATH" or "PATH:QUALNAME"."""
    where: str
    """PATH:LINE, as an editor takes it."""
    what: str
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.where}: {self.what} has {self.lines} lines, more than {self.limit}"


def python_files(root: Path) -> Iterator[Path]:
    """The modules under SOURCES, protoc's left out."""
    for source in SOURCES:
        for path in sorted((root / source).rglob("*.py")):
            if "_pb2" not in path.name:
                yield path


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method in `tree`, with its qualified name (Class.method,
    outer.inner)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:  # an `if`, `try` or `with` at module or class level
            yield from functions(node, prefix)


def oversizes(root: Path) -> Iterator[Oversize]:
    """Each module and function under `root` over its limit."""
    for path in python_files(root):
        name = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        count = len(text.splitlines())
        if count > MAX_FILE_LINES:
            yield Oversize(name, f"{name}:1", "the module", count, MAX_FILE_LINES)
        for qualname, node in functions(ast.parse(text, filename=name)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                where = f"{name}:{node.lineno}"
                what = f"function {qualname}"
                yield Oversize(f"{name}:{qualname}", where, what, length, MAX_FUNCTION_LINES)


def read_allowlist(path: Path) -> tuple[dict[str, str], list[str]]:
    """The allow-list's entries, and what is wrong with it (an entry without a one-line
    reason). A missing file allows nothing."""
    if not path.is_file():
        return {}, []
    with path.open("rb") as f:
        try:
            allow = tomllib.load(f).get("allow", {})
        except tomllib.TOMLDecodeError as exc:
            return {}, [f"{path}: {exc}"]
    if not isinstance(allow, dict):
        return {}, [f'{path}: [allow] must be a table of "PATH[:QUALNAME]" = "reason"']
    problems = [
        f"{path}: {key}: give a one-line reason"
        for key, reason in allow.items()
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason
    ]
    return {key: str(reason) for key, reason in allow.items()}, problems


def check(root: Path, allowlist: Path) -> list[str]:
    """What fails the check: each module or function over its limit that the allow-list
    does not name, each entry that names nothing over its limit, and a bad entry."""
    allowed, problems = read_allowlist(allowlist)
    found = list(oversizes(root))
    problems += [
        f"{over}: split it, or name {over.key!r} in {allowlist} with the reason"
        for over in found
        if over.key not in allowed
    ]
    over_keys = {over.key for over in found}
    problems += [
        f"{allowlist}: {key!r} is within its limit (or gone): take it off the list"
        for key in allowed
        if key not in over_keys
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check")
    parser.add_argument(
        "--allowlist", type=Path, help=f"the allow-list (default: ROOT/{ALLOWLIST})"
    )
    args = parser.parse_args(argv)
    allowlist = args.allowlist or args.root / ALLOWLIST
    problems = check(args.root, allowlist)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            f"check_sizes: modules at most {MAX_FILE_LINES} lines, functions at most "
            f"{MAX_FUNCTION_LINES} ({', '.join(SOURCES)})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
