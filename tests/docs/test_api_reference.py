"""docs/API.md is the complete HTTP reference: it is checked against the app itself.

- every route of the app (the OpenAPI schema's, the WebSocket and the console's) has a
  heading ``METHOD /path``;
- every request-body field and query/header parameter of the schema, every field of the
  OpenAI routes' request models (which read their bodies by hand, so the schema has
  none) and every query parameter those routes read appears in backticks in its route's
  section;
- every error code the code can answer, every task error code and every event kind
  appears in backticks.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import Any

import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from pydantic import BaseModel

from tests.conftest import make_settings
from tests.docs.markdown import ROOT, sections

PAGE = ROOT / "docs" / "API.md"
SRC = ROOT / "src" / "ponder"

#: routes that read their body by hand → the name of their request model (looked up in
#: the loaded ``ponder`` modules, wherever it lives)
HAND_READ_BODIES: dict[tuple[str, str], str] = {
    ("POST", "/v1/responses"): "ResponseCreateRequest",
    ("POST", "/v1/batches"): "BatchCreateRequest",
}


def _model(name: str) -> type[BaseModel]:
    _app()  # imports every route's module
    found = {
        getattr(module, name)
        for key, module in list(sys.modules.items())
        if key.startswith("ponder.") and isinstance(getattr(module, name, None), type)
    }
    assert len(found) == 1, f"{name}: found {found}"
    model = found.pop()
    assert issubclass(model, BaseModel)
    return model


@cache
def _app() -> Any:
    from ponder.api import create_app

    return create_app(make_settings())


@cache
def _route_sections() -> dict[str, str]:
    """``"METHOD /path"`` → its section's text, from the page's headings."""
    found: dict[str, str] = {}
    for heading, body in sections(PAGE.read_text(encoding="utf-8")):
        match = re.fullmatch(r"(GET|POST|PUT|PATCH|DELETE|WebSocket) (/\S*)", heading)
        if match:
            key = f"{match[1].upper()} {match[2]}"
            assert key not in found, f"two sections for {key}"
            found[key] = body
    return found


def _walk(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every API and WebSocket route with its full path (an included router is nested in
    ``app.routes`` by newer FastAPI versions, flattened by older ones)."""
    for route in routes:
        if isinstance(route, APIRoute | APIWebSocketRoute):
            yield prefix + route.path, route
        elif hasattr(route, "original_router"):
            context = getattr(route, "include_context", None)
            yield from _walk(route.original_router.routes, prefix + getattr(context, "prefix", ""))


def _routes() -> list[tuple[str, str, Callable[..., Any]]]:
    out = []
    for path, route in _walk(_app().routes):
        if isinstance(route, APIRoute):
            out += [(method, path, route.endpoint) for method in sorted(route.methods or ())]
        else:
            out.append(("WEBSOCKET", path, route.endpoint))
    return out


def _schema_fields() -> list[tuple[str, str]]:
    """``("METHOD /path", field)`` for every body field and parameter of the schema."""
    schema = _app().openapi()
    out = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            route = f"{method.upper()} {path}"
            for parameter in operation.get("parameters", []):
                if parameter["in"] != "path":
                    out.append((route, parameter["name"]))
            for content in operation.get("requestBody", {}).get("content", {}).values():
                body = content["schema"]
                if "$ref" in body:
                    body = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
                out += [(route, name) for name in body.get("properties", {})]
    return out


def _hand_read_fields() -> list[tuple[str, str]]:
    """Fields of the request models and query parameters that routes read by hand."""
    out = [
        (f"{method} {path}", name)
        for (method, path), model in HAND_READ_BODIES.items()
        for name in _model(model).model_fields
    ]
    read = re.compile(r"(?:query_params\.get|query_int)\(\s*(?:request,\s*)?\"(\w+)\"")
    form = re.compile(r"form\.get\(\"(\w+)\"\)")
    for method, path, endpoint in _routes():
        source = inspect.getsource(inspect.unwrap(endpoint))
        out += [(f"{method} {path}", name) for name in read.findall(source)]
        out += [(f"{method} {path}", name) for name in form.findall(source)]
    return out


def test_the_schema_is_read() -> None:
    fields = _schema_fields()
    assert ("POST /v1/tasks", "target_confidence") in fields
    assert ("GET /v1/tasks/{task_id}/events", "Last-Event-ID") in fields
    assert ("GET /v1/responses/{response_id}", "starting_after") in _hand_read_fields()
    assert len(_routes()) >= 30


@pytest.mark.parametrize("method,path", [(m, p) for m, p, _ in _routes()])
def test_every_route_has_a_section(method: str, path: str) -> None:
    key = f"{method} {path}"
    assert key in _route_sections(), f"docs/API.md has no heading `### {key}`"


def test_every_section_is_a_route() -> None:
    routes = {f"{m} {p}" for m, p, _ in _routes()}
    assert set(_route_sections()) <= routes, set(_route_sections()) - routes


@pytest.mark.parametrize("route,field", sorted(set(_schema_fields() + _hand_read_fields())))
def test_every_request_field_is_in_its_routes_section(route: str, field: str) -> None:
    section = _route_sections().get(route)
    assert section is not None, f"docs/API.md has no heading `### {route}`"
    # header names are case-insensitive; the schema spells them as the code does
    found = f"`{field}`" in section or f"`{field.lower()}`" in section.lower()
    assert found, f"`{field}` of {route} is not documented in its section"


def _error_codes() -> set[str]:
    """Every error code the source can answer or record."""
    patterns = [
        r"(?:ApiError|OpenAIError|error_response|_unauthorized)\(\s*\d{3},\s*\"(\w+)\"",
        r"_finish_failed\(\s*\"(\w+)\"",
        r"TaskError\(\s*code=\"(\w+)\"",
        r"error\(\s*number,\s*\"(\w+)\"",
        r"error_line\([^)]*?\"(\w+)\",\s*(?:\"|NOT_RUN)",
        r"\"code\":\s*\"(\w+)\"",
    ]
    codes: set[str] = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in patterns:
            codes.update(re.findall(pattern, text))
    from ponder.api.errors import _CODES
    from ponder.client import _ERRORS

    return codes | set(_CODES.values()) | set(_ERRORS)


def test_every_error_code_is_documented() -> None:
    codes = _error_codes()
    # the extraction finds the codes of each kind (a pattern that stopped matching fails)
    assert {"queue_full", "invalid_file", "too_many_attempts", "duplicate_custom_id"} <= codes
    assert {"task_expired", "model_not_found", "unsupported_media_type"} <= codes
    text = PAGE.read_text(encoding="utf-8")
    missing = sorted(code for code in codes if f"`{code}`" not in text)
    assert not missing, f"error codes missing from docs/API.md: {missing}"


def test_every_event_kind_is_documented() -> None:
    """Each kind of ``EventName`` is written by the source, and documented."""
    from ponder.types import EventName

    written = set()
    for path in SRC.rglob("*.py"):
        written.update(re.findall(r"\(EventName\.(\w+),", path.read_text(encoding="utf-8")))
    assert written == {e.name for e in EventName}, written
    table = dict(sections(PAGE.read_text(encoding="utf-8")))["Event kinds"]
    for kind in (e.value for e in EventName):
        assert f"| `{kind}` |" in table, kind
