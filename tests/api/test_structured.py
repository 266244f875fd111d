"""Structured answers (issue #46) on the task API: ``response_format`` accepted, refused
with a 422 naming the part of the schema (nothing created), and a structured task end to
end through the live server and the scripted engine."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

from tests.api.test_tasks import assert_error
from tests.conftest import wait_for_task

pytestmark = pytest.mark.timeout(60)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["buyer", "seller"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def _with_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize(
    "response_format",
    [JSON_SCHEMA, {"type": "json_object"}],
    ids=["json_schema", "json_object"],
)
async def test_response_format_is_accepted_and_shown(
    client: httpx.AsyncClient, response_format: dict[str, Any]
) -> None:
    body = {"prompt": "Who? [[answers: 1]]", "mode": "fast", "response_format": response_format}
    response = await client.post("/v1/tasks", json=body)
    assert response.status_code == 202, response.text
    shown = response.json()["response_format"]
    assert shown["type"] == response_format["type"]
    if "json_schema" in response_format:
        assert shown["json_schema"] == {**response_format["json_schema"], "description": None}
    else:
        assert shown["json_schema"] is None
    again = (await client.get(f"/v1/tasks/{response.json()['id']}")).json()
    assert again["response_format"] == shown


async def test_a_task_without_response_format_shows_null(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/tasks", json={"prompt": "x [[answers: 1]]", "mode": "fast"})
    assert response.status_code == 202
    assert response.json()["response_format"] is None


_ANY_OF = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}}
_NESTED = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "object", "$ref": "#/x"}}},
}


@pytest.mark.parametrize(
    ("response_format", "fragment"),
    [
        # malformed JSON Schema: the checker's path inside the schema
        (
            _with_schema({"type": "object", "properties": {"a": {"type": "strin"}}}),
            "response_format.json_schema.schema: properties.a.type: 'strin' is not valid",
        ),
        (_with_schema({"type": "object", "required": "a"}), "schema: required: 'a' is not"),
        # outside the subset
        (
            _with_schema(_ANY_OF),
            "response_format.json_schema.schema: properties.a: 'anyOf' is not supported",
        ),
        (_with_schema(_NESTED), "schema: properties.items.items: '$ref' is not supported"),
        (_with_schema({"type": "array"}), "the schema's root must be"),
        # the envelope's own shape
        ({"type": "json_schema"}, 'response_format: give "json_schema"'),
        ({"type": "json_object", "json_schema": _with_schema(PERSON)["json_schema"]}, "only then"),
        ({"type": "text"}, "response_format.type: Input should be 'json_schema' or"),
        ({"type": "json_object", "strict": True}, "response_format.strict: Extra inputs"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": PERSON, "strict": 1}},
            "response_format.json_schema.strict: Input should be a valid boolean",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": PERSON}},
            "response_format.json_schema.name: String should match pattern",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema: Field req"),
        ("json_object", "response_format: Input should be a valid dictionary"),
    ],
)
async def test_a_bad_response_format_is_422_naming_the_part(
    client: httpx.AsyncClient, response_format: Any, fragment: str
) -> None:
    body = {"prompt": "x", "response_format": response_format}
    message = assert_error(await client.post("/v1/tasks", json=body), 422, "invalid")["error"]
    assert fragment in message["message"]
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_nan_inside_a_schema_is_422(client: httpx.AsyncClient) -> None:
    body = (
        b'{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": '
        b'{"name": "x", "schema": {"type": "object", "properties": '
        b'{"a": {"type": "number", "maximum": NaN}}}}}}'
    )
    response = await client.post(
        "/v1/tasks", content=body, headers={"content-type": "application/json"}
    )
    message = assert_error(response, 422, "invalid")["error"]["message"]
    assert "response_format.json_schema.schema: `properties.a.maximum` is NaN" in message
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_both_request_parsers_make_the_same_structured_task(
    client: httpx.AsyncClient,
) -> None:
    # a valid body is validated in one pass; a run of over 100 digits (inside a string)
    # leaves it to FastAPI's handler: both keep the same response_format
    digits = "7" * 101
    body = {"prompt": f"Who? {digits}", "mode": "fast", "response_format": JSON_SCHEMA}
    quick = await client.post("/v1/tasks", json={**body, "prompt": "Who?"})
    slow = await client.post("/v1/tasks", json=body)
    assert quick.status_code == slow.status_code == 202, slow.text
    assert quick.json()["response_format"] == slow.json()["response_format"]
    assert slow.json()["response_format"]["json_schema"]["schema"] == PERSON


async def test_a_structured_task_answers_an_object_valid_for_its_schema(
    client: httpx.AsyncClient,
) -> None:
    body = {"prompt": "Who is the buyer?", "mode": "standard", "response_format": JSON_SCHEMA}
    response = await client.post("/v1/tasks", json=body)
    assert response.status_code == 202, response.text
    done = await wait_for_task(client, response.json()["id"])
    assert done["status"] == "done", done
    result = done["result"]
    assert isinstance(result, dict)
    jsonschema.validate(result["object"], PERSON)
    assert result["object_from"] in ("fields", "sample")
    assert set(result["fields"]) >= {"name", "age", "role"}
    for vote in result["fields"].values():
        assert 0 <= vote["confidence"] <= 1
        assert vote["votes"]
