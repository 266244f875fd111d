"""The JSON Schema subset of structured answers: what it accepts, and each refusal naming
the part of the schema to change."""

from __future__ import annotations

from typing import Any

import pytest

from ponder.schema_subset import MAX_DEPTH, MAX_PROPERTIES, check_schema


def _obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        _obj(name={"type": "string", "maxLength": 20}, age={"type": "integer", "minimum": 0}),
        _obj(kind={"enum": ["a", "b"]}, flag={"type": "boolean"}, none={"type": "null"}),
        _obj(when={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "format": "date"}),
        _obj(items={"type": "array", "maxItems": 3, "items": _obj(sku={"type": "string"})}),
        _obj(either={"type": ["string", "null"]}, fixed={"const": 3}),
    ],
)
def test_the_subset_is_accepted(schema: dict[str, Any]) -> None:
    check_schema(schema)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ([], "the schema must be a JSON object"),
        ({"type": "array"}, "root must be"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "properties.a.type"),
        (_obj(a={"anyOf": [{"type": "string"}]}), "properties.a: 'anyOf' is not supported"),
        ({"type": "object", "$defs": {}}, "the root: '$defs' is not supported"),
        (_obj(a={"type": "integer", "minLength": 1}), "'minLength' does not apply to type"),
        (_obj(a={"description": "no type"}), "properties.a: give a 'type'"),
        (_obj(a=True), "properties.a: give a schema object"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "must be true or false"),
        (_obj(a={"type": "string", "pattern": "^(?=x)y"}), "lookaround or a back-reference"),
        (_obj(a={"type": "string", "pattern": "(a)\\1"}), "lookaround or a back-reference"),
        (_obj(a={"type": "array", "items": _obj(b={"oneOf": []})}), "a.items.properties.b"),
        (_obj(a={"enum": []}), "'enum' must list at least one value"),
        (_obj(a={"type": "string", "minLength": 5, "maxLength": 2}), "'minLength' (5) is above"),
        (_obj(a={"type": "number", "minimum": 3, "maximum": 1}), "'minimum' (3) is above"),
        (_obj(a={"type": "integer", "minimum": 1.2, "maximum": 1.8}), "no integer lies between"),
    ],
)
def test_what_is_refused_is_named(schema: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_schema(schema)
    assert message in str(caught.value)


def test_depth_and_size_are_bounded() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_DEPTH + 1):
        deep = _obj(x=deep)
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
        check_schema(deep)
    wide = _obj(**{f"p{i}": {"type": "integer"} for i in range(MAX_PROPERTIES + 1)})
    with pytest.raises(ValueError, match=f"at most {MAX_PROPERTIES}"):
        check_schema(wide)
