"""The request of a task (:class:`TaskCreate`) and its validation; the caps that depend
on the settings are checked by :func:`ponder.admission.build_task`.

``POST /v1/tasks`` reads its body with this model, which is strict: an unknown field is
an error that names it (and the field meant, when one is close: ``max_tokens`` →
``max_new_tokens``); types are not coerced (no ``true`` for an integer, no ``"3"`` for a
number); NaN and Infinity are refused anywhere, metadata included; a prompt must have a
non-blank character; a callback URL has no user info and a real port; a
``response_format`` schema is valid JSON Schema inside the subset of
:mod:`ponder.schema_subset` (the error names the part). The SDK validates
its submits with the same model, so both answer the same error. The OpenAI-compatible
routes have their own, lenient models (:mod:`ponder.openai`), which become this one.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from ponder.schema_subset import check_schema
from ponder.types import DEFAULT_MODE, JsonSchemaFormat, Mode, ResponseFormat, TaskType

__all__ = [
    "ChatMessage",
    "JsonSchemaBody",
    "ModeField",
    "ResponseFormatBody",
    "StrictBody",
    "TaskCreate",
    "TaskTypeField",
    "describe_errors",
]

# an enum is given by its value ("math"), which strict mode would refuse
ModeField = Annotated[Mode, Field(strict=False)]
TaskTypeField = Annotated[TaskType, Field(strict=False)]

_UNKNOWN_FIELD = "unknown_field"
#: names from OpenAI's API that difflib would not match to ponder's own
_SYNONYMS = {"n": "samples"}
#: parts of a validation error's location that are not field names
_LOCATION_KINDS = ("body", "query", "path", "header")


def _unknown_field(name: str, known: Sequence[str]) -> str:
    meant = _SYNONYMS.get(name) or next(iter(difflib.get_close_matches(name, known, n=1)), None)
    return f"`{name}` (did you mean `{meant}`?)" if meant in known else f"`{name}`"


class StrictBody(BaseModel):
    """A JSON request body: unknown fields, coerced types and NaN/Infinity are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = list(cls.model_fields)
            unknown = [_unknown_field(str(k), known) for k in data if k not in cls.model_fields]
            if unknown:
                noun = "field" if len(unknown) == 1 else "fields"
                context = {"noun": noun, "fields": ", ".join(unknown)}
                raise PydanticCustomError(_UNKNOWN_FIELD, "unknown {noun} {fields}", context)
        return data


def _field_name(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc if p not in _LOCATION_KINDS) or "body"


def describe_errors(errors: Sequence[ErrorDetails]) -> str:
    """The first five validation errors on one line, each naming its field."""
    parts = []
    for error in errors[:5]:
        where = _field_name(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        unknown_at_top = error["type"] == _UNKNOWN_FIELD and where == "body"
        parts.append(message if unknown_at_top else f"{where}: {message}")
    return "; ".join(parts)


def _non_finite(value: Any) -> str | None:
    """The path of the first NaN or Infinity inside a JSON value (None: there is none).

    Iterative, so a deeply nested value cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        if isinstance(item, dict):
            stack.extend((f"{path}.{key}", sub) for key, sub in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))
    return None


class ChatMessage(StrictBody):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = Field(default=None, max_length=256)


def _finite_json(value: Any) -> None:
    """ValueError naming the first NaN or Infinity inside a JSON value."""
    path = _non_finite(value)
    if path is not None:
        raise ValueError(f"`{path.lstrip('.')}` is NaN or Infinity, which JSON has no number for")


class JsonSchemaBody(JsonSchemaFormat):
    """``response_format.json_schema`` in a request: as :class:`JsonSchemaFormat`, strict
    (no coercion, ``schema`` by that name only, no NaN inside it), the schema inside the
    supported subset (:func:`ponder.schema_subset.check_schema`, each problem named)."""

    model_config = ConfigDict(strict=True, validate_by_name=False, allow_inf_nan=False)

    @field_validator("schema_", mode="before")
    @classmethod
    def _finite_schema(cls, value: Any) -> Any:
        _finite_json(value)
        return value

    @field_validator("schema_")
    @classmethod
    def _in_the_subset(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_schema(value)
        return value


class ResponseFormatBody(ResponseFormat):
    """A request's ``response_format`` (:class:`~ponder.types.ResponseFormat`, strict);
    :meth:`format` is the task's."""

    model_config = ConfigDict(strict=True)

    json_schema: JsonSchemaBody | None = None

    def format(self) -> ResponseFormat:
        """The same format as the task stores it."""
        return ResponseFormat.model_validate(self.model_dump(by_alias=True))


class TaskCreate(StrictBody):
    """A task request (``POST /v1/tasks``). Caps that depend on the configured mode are
    checked by :func:`ponder.admission.build_task`."""

    prompt: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the model that answers: a name GET /v1/models lists (a configured "
        "model, NAME-<mode>, ponder, an alias); default: the default model (the models "
        "file's first)",
    )
    mode: ModeField = DEFAULT_MODE
    task_type: TaskTypeField = TaskType.auto
    priority: int = Field(default=3, ge=0, le=5)
    callback_url: HttpUrl | None = None
    samples: int | None = Field(default=None, ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    timeout_s: float | None = Field(default=None, gt=0)
    queue_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds the task may wait for a worker: not started by then, it ends "
        "expired and never runs; default: its model's queue_timeout_s, else "
        "PONDER_QUEUE_TIMEOUT_S (unset: no limit)",
    )
    tests: str | None = None
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=4, description="stop sequences: generation ends there"
    )
    early_stop: bool | None = Field(
        default=None, description="stop sampling once the vote is decided; default: the mode's"
    )
    target_confidence: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="early stop: P(leader stays leader) to reach; default: the mode's",
    )
    max_samples: int | None = Field(
        default=None,
        ge=1,
        description="the budget: at most this many samples (auto mode escalates no further)",
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="the budget: completion tokens over all samples; sampling stops when "
        "it is spent, with the best answer so far",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    response_format: ResponseFormatBody | None = Field(
        default=None,
        description='structured answers: {"type": "json_schema", "json_schema": {"name", '
        '"schema", "strict"}} (an object valid for the schema) or {"type": "json_object"} '
        "(docs/structured.md)",
    )

    @model_validator(mode="after")
    def _one_input(self) -> TaskCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` (a string) or `messages` (a chat list)")
        if self.samples and self.max_samples and self.samples > self.max_samples:
            raise ValueError(
                f"samples ({self.samples}) is over max_samples ({self.max_samples}); "
                "lower samples or raise max_samples"
            )
        return self

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("the prompt is blank; give some text")
        return value

    @field_validator("callback_url")
    @classmethod
    def _plain_http_url(cls, value: HttpUrl | None) -> HttpUrl | None:
        if value is None:
            return None
        if value.scheme not in ("http", "https"):
            raise ValueError("callback_url must be an http(s) URL")
        if value.username is not None or value.password is not None:
            raise ValueError("callback_url must not carry a user name or password")
        if value.port == 0:
            raise ValueError("callback_url: port 0 is not a port anything listens on")
        return value

    @field_validator("metadata")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        _finite_json(value)
        return value

    def body_hash(self) -> str:
        """A digest of the request as validated (for Idempotency-Key checks)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def prompt_chars(self) -> int:
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        return len(self.prompt or "")
