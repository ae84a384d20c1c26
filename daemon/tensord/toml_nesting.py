"""A linear scan of TOML text for nesting past a limit, before the TOML parser sees it.

tomllib checks each dotted key against every prefix of itself and of the table header
above it, so a key of n parts costs n² steps: `a.a.….b = 1` with 16 000 parts takes
seconds, and a 4 MiB file hours. No setting nests past a few levels, so text that nests
past the limit is refused here, at its line, in one pass.

Levels are counted as the parsed document's depth is: the document is level 1, and each
table, array and inline table is one level below the one holding it; a dotted key `a.b.c`
opens two tables below the one it sits in, a header `[a.b]` two below the document, an
array of tables `[[a.b]]` one more for its array. A header that reaches into an earlier
array of tables (`[a.b]` after `[[a]]`) is counted as if `a` were a table, one level short:
the scan never counts more levels than the document has, and the reader's depth check of
the parsed document stays the exact one.

The scan follows TOML's lexical structure only as far as it must to tell keys from values:
the four kinds of string, comments, brackets, braces, commas and line ends. Where the text
is not valid TOML it stops and leaves the error to the parser, which reads the same text
in the same order and stops there too, so the scan covers everything the parser reads.
Every repetition is possessive and strings cannot restart inside one another, so no
pattern backtracks: the scan is linear in the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The four kinds of string. A one-line string is not the start of a multi-line one (so an
# unterminated multi-line string is not retried as short ones), and a multi-line string
# may end with up to two quotes of its own before its closing three.
_ML_BASIC = r'"""(?:[^"\\]++|\\(?s:.)|"{1,2}+(?!"))*+"{3,5}+'
_ML_LITERAL = r"'''(?:[^']++|'{1,2}+(?!'))*+'{3,5}+"
_BASIC = r'"(?!"")(?:[^"\\\n]++|\\.)*+"'
_LITERAL = r"'(?!'')[^'\n]*+'"
_STRING = f"{_ML_BASIC}|{_ML_LITERAL}|{_BASIC}|{_LITERAL}"

_BLANK = re.compile(r"(?:[ \t\r\n]++|#[^\n]*+)*+")
"""Space, line ends and comments between top-level lines."""
_SPACE = re.compile(r"[ \t]*+")
_KEY_PART = re.compile(rf"[ \t]*+(?:[A-Za-z0-9_-]++|{_BASIC}|{_LITERAL})?+[ \t]*+")
"""One part of a dotted key, with the space around it."""
_SCALAR = re.compile(rf"""(?:{_STRING}|[^"'#\[\]{{}},\n]++)[ \t]*+""")
"""A value that is not an array or inline table, and the space after it."""
_ARRAY_SKIP = re.compile(rf"""(?:{_STRING}|#[^\n]*+|[^"'#\[\]{{}}]++)*+""")
"""Inside an array: everything up to the next bracket or brace."""


@dataclass(slots=True, frozen=True)
class TooDeep:
    """Where the text first nests past the limit: its 1-based line, and the level reached."""

    line: int
    level: int


class _Found(Exception):
    def __init__(self, level: int, pos: int) -> None:
        self.level, self.pos = level, pos


class _Invalid(Exception):
    """Not TOML here: the parser says why."""


@dataclass(slots=True)
class _Open:
    """An open inline table (the level of its keys) or array (the level of its items)."""

    table: bool
    level: int


class _Scan:
    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit
        self.pos = 0
        self.open: list[_Open] = []
        self.table_level = 1
        """The level of the table that top-level keys go into (after a header, its table)."""

    def run(self) -> None:
        while self.pos < len(self.text):
            if not self.open:
                self._top_level_line()
            elif self.open[-1].table:
                self._inline_table_entry()
            else:
                self._array_item()

    def _top_level_line(self) -> None:
        text = self.text
        self.pos = _skip(_BLANK, text, self.pos)
        if self.pos == len(text):
            return
        start = self.pos
        if text.startswith("[", start):  # a table header
            close = "]]" if text.startswith("[[", start) else "]"
            self.pos += len(close)
            level = len(close) + self._key(1 + len(close), start)
            if level > self.limit:
                raise _Found(level, start)
            if not text.startswith(close, self.pos):
                raise _Invalid
            self.pos += len(close)
            self.table_level = level
            return
        parts = self._key(self.table_level, start)
        self._value(self.table_level + parts)

    def _inline_table_entry(self) -> None:
        self.pos = _skip(_SPACE, self.text, self.pos)
        if self.text.startswith("}", self.pos):  # an empty inline table
            self.pos += 1
            self.open.pop()
            self._after_value()
            return
        level = self.open[-1].level
        self._value(level + self._key(level, self.pos))

    def _key(self, level: int, start: int) -> int:
        """Read a dotted key whose first part sits at `level`; its number of parts."""
        text, parts = self.text, 1
        self.pos = _skip(_KEY_PART, text, self.pos)
        while text.startswith(".", self.pos):
            parts += 1
            if level + parts - 1 > self.limit:
                raise _Found(level + parts - 1, start)
            self.pos = _skip(_KEY_PART, text, self.pos + 1)
        return parts

    def _value(self, level: int) -> None:
        """After a key: `=` and a value at `level` (an array or inline table opens)."""
        text = self.text
        if not text.startswith("=", self.pos):
            raise _Invalid
        self.pos = _skip(_SPACE, text, self.pos + 1)
        if text.startswith(("[", "{"), self.pos):
            self._open(level)
            return
        scalar = _SCALAR.match(text, self.pos)
        if scalar is None:
            raise _Invalid
        self.pos = scalar.end()
        self._after_value()

    def _open(self, level: int) -> None:
        """Open the array or inline table at `pos`, itself at `level`."""
        if level > self.limit:
            raise _Found(level, self.pos)
        table = self.text.startswith("{", self.pos)
        self.open.append(_Open(table, level if table else level + 1))
        self.pos += 1

    def _after_value(self) -> None:
        """After a value in an inline table: `,` and the next key, or `}` closing it."""
        text = self.text
        while self.open and self.open[-1].table:
            self.pos = _skip(_SPACE, text, self.pos)
            if text.startswith(",", self.pos):
                self.pos += 1
                return
            if not text.startswith("}", self.pos):
                raise _Invalid
            self.pos += 1
            self.open.pop()

    def _array_item(self) -> None:
        text = self.text
        self.pos = _skip(_ARRAY_SKIP, text, self.pos)
        if text.startswith(("[", "{"), self.pos):
            self._open(self.open[-1].level)
        elif text.startswith("]", self.pos):
            self.pos += 1
            self.open.pop()
            self._after_value()
        else:  # the end of the text, a stray brace or a string that does not end
            raise _Invalid


def _skip(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where `pattern` (one that also matches nothing) ends, from `pos`."""
    match = pattern.match(text, pos)
    assert match is not None
    return match.end()


def find_too_deep(text: str, limit: int) -> TooDeep | None:
    """The first place where `text` nests past `limit` levels, or None (also when the
    text is not valid TOML before that: the parser reports it)."""
    try:
        _Scan(text, limit).run()
    except _Invalid:
        return None
    except _Found as found:
        return TooDeep(text.count("\n", 0, found.pos) + 1, found.level)
    return None
