"""Structured answers (issue #46) on the OpenAI-compatible APIs, driven by the official
``openai`` SDK against a live server: chat ``response_format`` (``create`` and ``parse``
with a pydantic model), the Responses API's ``text.format`` (background and ``parse``),
a Batch line, and the refusals in OpenAI's shape with nothing created."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from tests.api.sdk import retrieve_until
from tests.api.test_batches import chat_line, read_file, upload
from tests.api.test_structured import JSON_SCHEMA, PERSON
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(60)

FLAT = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
ANY_OF = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}}


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    role: Literal["buyer", "seller"]


@pytest.fixture
async def http(live: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as c:
        yield c


def ponder_of(obj: Any) -> dict[str, Any]:
    ponder: dict[str, Any] = (obj.model_extra or {})["ponder"]
    return ponder


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def no_tasks(http: httpx.AsyncClient) -> bool:
    return (await http.get("/v1/tasks")).json()["data"] == []


# --- chat completions -----------------------------------------------------------------
async def test_chat_json_schema_answers_the_object_as_content(
    sdk: AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    completion = await sdk.chat.completions.create(
        model="ponder", messages=user("Who is the buyer?"), response_format=JSON_SCHEMA
    )
    content = completion.choices[0].message.content
    assert content is not None
    answer = json.loads(content)
    jsonschema.validate(answer, PERSON)
    ponder = ponder_of(completion)
    assert answer == ponder["object"] and ponder["fields"]
    task = (await http.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert task["response_format"]["json_schema"]["schema"] == PERSON
    assert task["response_format"]["json_schema"]["strict"] is True


async def test_chat_parse_with_a_pydantic_model(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.parse(
        model="ponder-fast", messages=user("Who is the seller?"), response_format=Person
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person)
    assert parsed.model_dump() == ponder_of(completion)["object"]


async def test_chat_json_object_and_text(sdk: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    completion = await sdk.chat.completions.create(
        model="ponder-fast", messages=user("Any object"), response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)
    task_id = ponder_of(completion)["task_id"]
    assert (await http.get(f"/v1/tasks/{task_id}")).json()["response_format"] == {
        "type": "json_object",
        "json_schema": None,
    }
    prose = await sdk.chat.completions.create(
        model="ponder-fast", messages=user("[[answers: 7]]"), response_format={"type": "text"}
    )
    assert (prose.choices[0].message.content or "").endswith("The answer is 7.")
    task = (await http.get(f"/v1/tasks/{ponder_of(prose)['task_id']}")).json()
    assert task["response_format"] is None


async def test_chat_streams_the_object_as_its_content(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder-fast",
        messages=user("Who is the buyer?"),
        response_format=JSON_SCHEMA,
        stream=True,
    )
    content = ""
    async for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
    jsonschema.validate(json.loads(content), PERSON)


@pytest.mark.parametrize(
    ("response_format", "fragment"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": ANY_OF}},
            "response_format.json_schema.schema: properties.a: 'anyOf' is not supported",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
            "the schema's root must be",
        ),
        ({"type": "json_schema"}, 'response_format: give "json_schema"'),
        ({"type": "xml"}, "response_format.type: Input should be"),
        ("json", "response_format: give an object with a `type`"),
    ],
)
async def test_chat_refuses_a_bad_response_format(
    sdk: AsyncOpenAI, http: httpx.AsyncClient, response_format: Any, fragment: str
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(
            model="ponder", messages=user("x"), response_format=response_format
        )
    error = info.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error" and error["param"] == "response_format"
    assert fragment in error["message"]
    assert await no_tasks(http)


# --- responses ------------------------------------------------------------------------
async def test_a_background_response_with_text_format(sdk: AsyncOpenAI) -> None:
    created = await sdk.responses.create(
        model="ponder", input="Who is the buyer?", text={"format": FLAT}, background=True
    )
    assert created.text is not None and created.text.format is not None
    assert created.text.format.type == "json_schema"
    done = await retrieve_until(sdk.responses.retrieve, created.id, ("completed",), 20, 0.02)
    answer = json.loads(done.output_text)
    jsonschema.validate(answer, PERSON)
    assert answer == ponder_of(done)["object"]
    echoed = done.text.format.model_dump(by_alias=True)
    assert echoed["name"] == "person" and echoed["schema"] == PERSON and echoed["strict"]


async def test_responses_parse_and_json_object(sdk: AsyncOpenAI) -> None:
    parsed = await sdk.responses.parse(
        model="ponder-fast", input="Who is the seller?", text_format=Person
    )
    assert isinstance(parsed.output_parsed, Person)
    plain = await sdk.responses.create(
        model="ponder-fast", input="Any object", text={"format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(plain.output_text), dict)
    assert plain.text is not None and plain.text.format is not None
    assert plain.text.format.type == "json_object"


async def test_responses_refuse_a_bad_text_format(
    sdk: AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    bad = {"type": "json_schema", "name": "x", "schema": ANY_OF}
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.responses.create(
            model="ponder",
            input="x",
            text={"format": bad},
            background=True,  # type: ignore[typeddict-item]
        )
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "text.format"
    assert "text.format.schema: properties.a: 'anyOf' is not supported" in error["message"]
    assert await no_tasks(http)


# --- batch ----------------------------------------------------------------------------
async def test_a_batch_line_with_response_format(sdk: AsyncOpenAI) -> None:
    lines = [
        chat_line("person", "Who is the buyer?", response_format=JSON_SCHEMA),
        chat_line("bad", "x", response_format={"type": "json_schema"}),
        {
            "custom_id": "resp",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "ponder-fast", "input": "x", "text": {"format": FLAT}},
        },
    ]
    chat_file = await upload(sdk, lines[:2])
    batch = await sdk.batches.create(
        input_file_id=chat_file, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await retrieve_until(sdk.batches.retrieve, batch.id, ("completed",), 30, 0.05)
    out = {line["custom_id"]: line for line in await read_file(sdk, done.output_file_id)}
    out |= {line["custom_id"]: line for line in await read_file(sdk, done.error_file_id)}
    body = out["person"]["response"]["body"]
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), PERSON)
    refused = out["bad"]["response"]
    assert refused["status_code"] == 422
    assert refused["body"]["error"]["param"] == "body.response_format"
    responses_file = await upload(sdk, lines[2:])
    batch = await sdk.batches.create(
        input_file_id=responses_file, endpoint="/v1/responses", completion_window="24h"
    )
    done = await retrieve_until(sdk.batches.retrieve, batch.id, ("completed",), 30, 0.05)
    [line] = await read_file(sdk, done.output_file_id)
    output = line["response"]["body"]["output"][0]["content"][0]["text"]
    jsonschema.validate(json.loads(output), PERSON)
