"""Bounded JSON schemas for structured output's tests: every value a schema accepts has a
short compact serialisation (strings with maxLength or bounded patterns, arrays with
maxItems, integers with bounds, numbers with bounds and a multipleOf, closed objects), so
that a model, even one with random weights, must finish each within MAX_TOKENS tokens
(each character at most one token)."""

from __future__ import annotations

import json
from typing import Any

MAX_TOKENS = 200
"""Tokens each reply may take: above the longest serialisation of any schema below."""


def _obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> Any:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


_NAME = {"type": "string", "maxLength": 8}
_AGE = {"type": "integer", "minimum": 0, "maximum": 120}
_SCORE = {"type": "number", "minimum": -5, "maximum": 5, "multipleOf": 0.5}

SCHEMAS: dict[str, Any] = {
    "string": {"type": "string", "maxLength": 12},
    "integer": {"type": "integer", "minimum": -1000, "maximum": 1000},
    "number": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "enum_strings": {"enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": ["a", 1, True, None]},
    "const": {"const": {"ok": True}},
    "person": _obj({"name": _NAME, "age": _AGE}),
    "optional_field": _obj({"name": _NAME, "nick": _NAME}, required=["name"]),
    "no_required": _obj(
        {"a": {"type": "boolean"}, "b": {"type": "integer", "maximum": 9, "minimum": 0}},
        required=[],
    ),
    "nested": _obj(
        {
            "user": _obj(
                {
                    "name": _NAME,
                    "address": _obj(
                        {"city": _NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
                    ),
                }
            )
        }
    ),
    "array_of_ints": {"type": "array", "items": _AGE, "maxItems": 4},
    "array_min_max": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    "array_of_objects": {"type": "array", "items": _obj({"id": _AGE, "tag": _NAME}), "maxItems": 2},
    "tuple": {"type": "array", "prefixItems": [_NAME, _AGE], "items": False, "minItems": 2},
    "enum_in_object": _obj(
        {"color": {"enum": ["red", "green"]}, "size": {"enum": ["S", "M", "L"]}}
    ),
    "pattern": {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"},
    "pattern_in_object": _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    "string_lengths": _obj({"s": {"type": "string", "minLength": 2, "maxLength": 4}}),
    "defs_ref": {
        "$defs": {"point": _obj({"x": _AGE, "y": _AGE})},
        **_obj({"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}),
    },
    "defs_nested_ref": {
        "$defs": {"name": _NAME, "pet": _obj({"name": {"$ref": "#/$defs/name"}, "legs": _AGE})},
        **_obj({"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2}}),
    },
    "any_of": {"anyOf": [_AGE, _NAME, {"type": "null"}]},
    "any_of_objects": {
        "anyOf": [
            _obj({"kind": {"const": "cat"}, "lives": _AGE}),
            _obj({"kind": {"const": "dog"}, "good": {"type": "boolean"}}),
        ]
    },
    "nullable": _obj({"v": {"type": ["integer", "null"], "minimum": 0, "maximum": 50}}),
    "numbers_with_bounds": _obj(
        {
            "score": _SCORE,
            "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 10, "multipleOf": 0.5},
        }
    ),
    "integer_exclusive": _obj(
        {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}
    ),
    "mixed_record": _obj(
        {
            "id": _AGE,
            "name": _NAME,
            "active": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
            "score": _SCORE,
        }
    ),
    "matrix": {
        "type": "array",
        "items": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 2,
        },
        "maxItems": 2,
    },
    "date_string": _obj(
        {"day": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}
    ),
    "deep": _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "boolean"}})})})}),
    "one_of_enum": {"oneOf": [{"const": "yes"}, {"const": "no"}]},
}
"""Name -> schema: nested objects, arrays with maxItems, enums, required, $defs/$ref, anyOf,
numbers with bounds, strings with maxLength or patterns."""


def schema_text(name: str) -> str:
    return json.dumps(SCHEMAS[name])
