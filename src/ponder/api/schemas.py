"""Request bodies of the HTTP API and their validation (limits come from the settings)."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from ponder.types import TaskType

__all__ = ["ChatMessage", "ErrorBody", "TaskCreate", "TaskList"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class TaskCreate(BaseModel):
    """``POST /v1/tasks``. Caps that depend on the configured mode are checked by the API."""

    prompt: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    mode: Literal["fast", "standard", "deep"] = "standard"
    task_type: TaskType = TaskType.auto
    priority: int = Field(default=3, ge=0, le=5)
    callback_url: HttpUrl | None = None
    samples: int | None = Field(default=None, ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    timeout_s: float | None = Field(default=None, gt=0)
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
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_input(self) -> TaskCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` (a string) or `messages` (a chat list)")
        return self

    @field_validator("callback_url")
    @classmethod
    def _http_only(cls, value: HttpUrl | None) -> HttpUrl | None:
        if value is not None and value.scheme not in ("http", "https"):
            raise ValueError("callback_url must be an http(s) URL")
        return value

    def body_hash(self) -> str:
        """A digest of the request as validated (for Idempotency-Key checks)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def prompt_chars(self) -> int:
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        return len(self.prompt or "")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class TaskList(BaseModel):
    data: list[dict[str, Any]]
    next_cursor: str | None
