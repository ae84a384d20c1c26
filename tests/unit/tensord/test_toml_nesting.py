"""The linear nesting scan before the TOML parser: the level and line it reports, and its
agreement with the depth of the parsed document."""

from __future__ import annotations

import random
import tomllib

import pytest

from tensord.files import _depth
from tensord.toml_nesting import TooDeep, find_too_deep


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("a.b.c = 1\n", None),
        ("a.b.c.d = 1\n", TooDeep(1, 4)),
        ("x = 1\na . b\t. c .d = 1\n", TooDeep(2, 4)),
        ('a."b.c".d = 1\n', None),
        ("a.'b.c'.d.e = 1\n", TooDeep(1, 4)),
        ("[a.b]\nc = 1\n", None),
        ("[a.b]\nc.d = 1\n", TooDeep(2, 4)),
        ("[a.b.c]\n", TooDeep(1, 4)),
        ("[[a.b]]\n", TooDeep(1, 4)),
        ("[[a]]\nb = 1\n", None),
        ("[[a]]\nb.c = 1\n", TooDeep(2, 4)),
        ("x = [[1]]\n", None),
        ("x = [[[1]]]\n", TooDeep(1, 4)),
        ("x = {a = {b = 1}}\n", None),
        ("x = {a = {b = {}}}\n", TooDeep(1, 4)),
        ("x = [\n  # ] {\n  ']', \"[\",\n  {a = 1},\n  {a.b = 1},\n]\n", TooDeep(5, 4)),
        ('s = "a.b.c.d.e" # [x.y.z.w]\n', None),
        ('s = """\n[a.b.c.d]\na.b.c.d = 1 ""\\""""\nt = 1\n', None),
        ("s = '''\n[a.b.c.d]\n''''\nt = 1\n", None),
        ("[a]\n[b]\nc.d = {e = 1}\n", TooDeep(3, 4)),
        ('s = "unterminated\na.b.c.d = 1\n', None),  # the parser reports the string
    ],
)
def test_levels_and_lines(text: str, found: TooDeep | None) -> None:
    assert find_too_deep(text, 3) == found


def test_the_scan_agrees_with_the_parsed_depth() -> None:
    """Random documents of every construct: the scan finds nesting past the limit exactly
    when the parsed document has it (no array of tables: a header reaching into one is
    counted one level short, by design)."""
    rng = random.Random(5)
    checked = 0
    while checked < 400:
        text = _document(rng)
        try:
            depth = _depth(tomllib.loads(text))
        except tomllib.TOMLDecodeError:
            continue  # a key defined twice, say
        checked += 1
        for limit in range(1, depth + 2):
            assert (find_too_deep(text, limit) is not None) == (depth > limit), (text, limit)


_TEXTS = ("a.b", "#x", "[y]", "{z}", "= 1", "q'q", ",", "\\", '"""', "'''", "", ". .")


def _basic(rng: random.Random) -> str:
    text = rng.choice(_TEXTS).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}{rng.randint(0, 99)}"'


def _key(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice("abcxyz_-") + str(rng.randint(0, 99))
    if roll < 0.8:
        return _basic(rng)
    return f"'{rng.choice([t for t in _TEXTS if chr(39) not in t])}{rng.randint(0, 99)}'"


def _dotted(rng: random.Random, most: int) -> str:
    separator = rng.choice([".", " . ", "\t.", ". "])
    return separator.join(_key(rng) for _ in range(rng.randint(1, most)))


def _scalar(rng: random.Random) -> str:
    return rng.choice(
        [
            "-3",
            "1.5e3",
            "1979-05-27T07:32:00Z",
            "true",
            _basic(rng),
            '"""\n' + rng.choice(_TEXTS).replace("\\", "\\\\").replace('"""', '""\\"') + '"""',
            "'''[a.b]\n{c.d}''''",
        ]
    )


def _value(rng: random.Random, depth: int, lines: bool) -> str:
    roll = rng.random()
    if depth and roll < 0.3:
        separator = ',\n  # ] { "\n' if lines and rng.random() < 0.5 else ", "
        items = [_value(rng, depth - 1, lines) for _ in range(rng.randint(0, 3))]
        return "[" + separator.join(items) + rng.choice(["", ","]) + "]"
    if depth and roll < 0.6:
        entries = [
            f"{_dotted(rng, 3)} = {_value(rng, depth - 1, False)}" for _ in range(rng.randint(0, 3))
        ]
        return "{" + ", ".join(entries) + "}"
    return _scalar(rng)


def _document(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.3:
            lines.append(f"[{_dotted(rng, 4)}]  # [x.y]")
        elif rng.random() < 0.2:
            lines.append("# a = [ { \" '")
        for _ in range(rng.randint(0, 3)):
            lines.append(f"{_dotted(rng, 4)} = {_value(rng, rng.randint(0, 4), True)} # t")
    return "\n".join(lines) + "\n"
