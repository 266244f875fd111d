"""Response bodies of the HTTP API that its OpenAPI schema names: the error envelope and
a page of tasks. The request of a task is :class:`ponder.schemas.TaskCreate`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# The SDK (ponder.client) still reads the task request from here; it moves to
# ponder.schemas, and these two names then leave this module.
from ponder.schemas import TaskCreate, describe_errors

__all__ = ["ErrorBody", "ErrorDetail", "TaskCreate", "TaskList", "describe_errors"]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class TaskList(BaseModel):
    data: list[dict[str, Any]]
    next_cursor: str | None
