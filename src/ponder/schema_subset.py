"""The JSON Schema subset that structured answers accept.

A task's ``response_format`` schema is checked twice before anything is created: against
JSON Schema (draft 2020-12) itself, then against the subset every engine can constrain
decoding to and the per-field vote can vote over (docs/structured.md):

- the root is an object (``"type": "object"``), as OpenAI's structured outputs require;
- each subschema names a ``type`` (one of :data:`TYPES`) or an ``enum``/``const``;
- ``object``: ``properties``, ``required``, ``additionalProperties`` (a boolean);
- ``array``: ``items`` (one schema), ``minItems``, ``maxItems``;
- ``string``: ``minLength``, ``maxLength``, ``pattern`` (a regular expression without
  lookaround or back-references: the grammar engines cannot constrain to those),
  ``format`` (an annotation);
- numbers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``;
- anywhere: ``title``, ``description``, ``default``, ``examples``.

A schema no value can satisfy (an empty ``enum``, a minimum above its maximum) is refused
too. Anything else (``$ref``, ``anyOf``, ``oneOf``, ``allOf``, ``not``, conditionals,
``patternProperties``, ``prefixItems``, …) is refused with the path of the keyword, as is a
schema deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_PROPERTIES` properties in
all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

__all__ = ["MAX_DEPTH", "MAX_PROPERTIES", "TYPES", "check_schema"]

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_DEPTH = 8
MAX_PROPERTIES = 100

_ANYWHERE = frozenset({"type", "enum", "const", "title", "description", "default", "examples"})
_BY_TYPE: Mapping[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
_KNOWN = _ANYWHERE.union(*_BY_TYPE.values())


def check_schema(schema: Any) -> None:
    """Raise ValueError naming the first problem (with the path inside the schema, e.g.
    ``properties.items.items: 'anyOf' is not supported``) unless ``schema`` is valid JSON
    Schema inside the subset."""
    if not isinstance(schema, dict):
        raise ValueError("the schema must be a JSON object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = ".".join(str(p) for p in e.path) or "the schema"
        raise ValueError(f"{where}: {e.message}") from None
    if schema.get("type") != "object":
        raise ValueError('the schema\'s root must be {"type": "object", ...}')
    problem = next(_problems(schema, "", 0), None)
    if problem is not None:
        raise ValueError(problem)
    if (count := sum(1 for _ in _properties(schema))) > MAX_PROPERTIES:
        raise ValueError(f"the schema has {count} properties; at most {MAX_PROPERTIES}")


def _problems(schema: Mapping[str, Any], path: str, depth: int) -> Iterator[str]:
    where = path or "the root"
    if depth > MAX_DEPTH:
        yield f"{where}: nested deeper than {MAX_DEPTH} levels"
        return
    for key in schema:
        if key not in _KNOWN:
            yield f"{where}: {key!r} is not supported (docs/structured.md lists what is)"
            return
    kinds = schema.get("type")
    names = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if not names and "enum" not in schema and "const" not in schema:
        yield f"{where}: give a 'type' (one of {', '.join(sorted(TYPES))}), an 'enum' or a 'const'"
        return
    allowed = _ANYWHERE.union(*(_BY_TYPE.get(name, frozenset()) for name in names))
    for key in schema:
        if key not in allowed:
            yield f"{where}: {key!r} does not apply to type {kinds!r}"
            return
    if (why := _unsatisfiable(schema)) is not None:
        yield f"{where}: {why}"
        return
    if (why := _pattern_problem(schema.get("pattern"))) is not None:
        yield f"{where}: 'pattern' {why}"
        return
    if isinstance(schema.get("additionalProperties"), dict):
        yield f"{where}: 'additionalProperties' must be true or false"
        return
    subschemas = [(f"properties.{name}", sub) for name, sub in schema.get("properties", {}).items()]
    if "items" in schema:
        subschemas.append(("items", schema["items"]))
    for key, sub in subschemas:
        inner = f"{path}.{key}".lstrip(".")
        if not isinstance(sub, dict):
            yield f"{inner}: give a schema object (true and false are not supported)"
            return
        yield from _problems(sub, inner, depth + 1)


def _unsatisfiable(schema: Mapping[str, Any]) -> str | None:
    """Why no value can be valid for ``schema`` (an empty enum, crossed bounds, an
    integer range with no integer in it), or None."""
    if "enum" in schema and not schema["enum"]:
        return "'enum' must list at least one value"
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"),
                      ("minimum", "maximum")):  # fmt: skip
        if low in schema and high in schema and schema[low] > schema[high]:
            return f"{low!r} ({schema[low]}) is above {high!r} ({schema[high]})"
    bounded = schema.get("type") == "integer" and "minimum" in schema and "maximum" in schema
    if bounded and math.ceil(schema["minimum"]) > math.floor(schema["maximum"]):
        return "no integer lies between 'minimum' and 'maximum'"
    return None


#: what a grammar cannot constrain to: lookahead, lookbehind, back-references
_UNCONSTRAINABLE = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]|\\k<")


def _pattern_problem(pattern: Any) -> str | None:
    if pattern is None:
        return None
    try:
        re.compile(pattern)
    except (re.error, TypeError) as e:
        return f"is not a regular expression ({e})"
    if _UNCONSTRAINABLE.search(pattern):
        return "uses lookaround or a back-reference, which decoding cannot be constrained to"
    return None


def _properties(schema: Mapping[str, Any]) -> Iterator[str]:
    for name, sub in (schema.get("properties") or {}).items():
        yield name
        if isinstance(sub, dict):
            yield from _properties(sub)
    if isinstance(schema.get("items"), dict):
        yield from _properties(schema["items"])
