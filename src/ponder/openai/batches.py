"""The Batch API's data: batch objects, input file checks, the output file lines.

A batch is a store object of kind ``batch``: ``data["batch"]`` is OpenAI's batch object,
``data["state"]`` the feeder's progress (the next line to admit, the lines in flight and
their tasks, how the batch is ending). The feeder that runs them is
:mod:`ponder.openai.batch_feeder`; the routes are :mod:`ponder.api.batches` and
:class:`BatchCreateRequest` their body.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ponder import admission
from ponder.errors import AdmissionError
from ponder.openai.common import OpenAIError, check_metadata, invalid
from ponder.states import is_terminal
from ponder.store.base import StoredObject, TaskRecords
from ponder.types import Task, TaskStatus

__all__ = [
    "ENDPOINTS",
    "KIND",
    "NOT_RUN",
    "BatchCreateRequest",
    "BatchLine",
    "BatchStatus",
    "batch_request",
    "check_batch_file",
    "error_line",
    "new_batch",
    "output_line",
    "parse_window",
    "public_batch",
    "read_lines",
    "usage_object",
]

KIND = "batch"
ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
_WINDOW = re.compile(r"^(\d{1,6})([smh])$")
_MAX_WINDOW_S = 86_400
_MAX_CUSTOM_ID = 512


class BatchStatus(StrEnum):
    """A batch's ``status`` (OpenAI's names; stored and answered as these strings).

    ``validating`` → ``in_progress`` → ``finalizing`` → ``completed``; or ``failed`` (the
    input file), ``expired`` (the completion window), ``cancelling`` → ``cancelled``.
    """

    validating = "validating"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    failed = "failed"
    expired = "expired"
    cancelling = "cancelling"
    cancelled = "cancelled"


class BatchCreateRequest(BaseModel):
    """The fields of OpenAI's batch request that ponder reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(max_length=200)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    # ponder's extension (the OpenAI SDK's ``extra_body``)
    webhook_url: str | None = Field(default=None, max_length=2000)

    _metadata = field_validator("metadata")(check_metadata)


def batch_request(body: dict[str, Any]) -> BatchCreateRequest:
    """A batch request body as the request: its fields, its endpoint (one of
    :data:`ENDPOINTS`) and its ``completion_window``; errors in OpenAI's shape."""
    try:
        req = BatchCreateRequest.model_validate(body)
    except ValidationError as e:
        raise invalid(e) from e
    if req.endpoint not in ENDPOINTS:
        raise OpenAIError(
            422, "invalid", f"endpoint: give one of {', '.join(ENDPOINTS)}", param="endpoint"
        )
    try:
        parse_window(req.completion_window)
    except ValueError as e:
        raise OpenAIError(
            422, "invalid", f"completion_window: {e}", param="completion_window"
        ) from e
    return req


def parse_window(window: str) -> int:
    """A ``completion_window`` in seconds: OpenAI's ``24h``, or (ponder) any shorter
    ``<n>s|m|h``. ValueError otherwise."""
    match = _WINDOW.match(window)
    seconds = int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]] if match else 0
    if not 0 < seconds <= _MAX_WINDOW_S:
        raise ValueError("give 24h (or a shorter window such as 30m, 90s)")
    return seconds


def check_batch_file(text: str, max_lines: int) -> int:
    """How many requests a batch input file holds; ValueError naming the first bad line
    (not a JSON object) or the line limit."""
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        count += 1
        if count > max_lines:
            raise ValueError(f"line {number}: over the limit of {max_lines} requests per file")
        try:
            parsed = json.loads(line)
        except ValueError as e:
            raise ValueError(f"line {number}: not valid JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"line {number}: not a JSON object")
    if count == 0:
        raise ValueError("the file holds no requests")
    return count


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch's input file."""

    number: int  # the line number in the file (1-based)
    custom_id: str
    body: dict[str, Any]


def read_lines(text: str, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The requests of an input file, and its errors (OpenAI's batch ``errors``)."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def error(number: int, code: str, message: str, param: str | None = None) -> None:
        errors.append({"code": code, "line": number, "message": message, "param": param})

    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            error(number, "invalid_json_line", f"line {number}: not a JSON object")
            continue
        custom_id = entry.get("custom_id")
        if not isinstance(custom_id, str) or not 0 < len(custom_id) <= _MAX_CUSTOM_ID:
            error(
                number,
                "invalid_custom_id",
                f"line {number}: custom_id must be a string of 1 to {_MAX_CUSTOM_ID} characters",
                "custom_id",
            )
        elif custom_id in seen:
            error(
                number,
                "duplicate_custom_id",
                f"line {number}: custom_id {custom_id!r} is used by an earlier line",
                "custom_id",
            )
        elif entry.get("method", "POST") != "POST":
            error(number, "invalid_method", f"line {number}: method must be POST", "method")
        elif entry.get("url") != endpoint:
            error(
                number,
                "mismatched_url",
                f"line {number}: url must be the batch's endpoint {endpoint}",
                "url",
            )
        elif not isinstance(entry.get("body"), dict):
            error(number, "invalid_body", f"line {number}: body must be a JSON object", "body")
        else:
            seen.add(custom_id)
            lines.append(BatchLine(number, custom_id, entry["body"]))
    return lines, errors


def new_batch(
    batch_id: str,
    *,
    input_file_id: str,
    endpoint: str,
    window: str,
    metadata: dict[str, str] | None,
    webhook_url: str | None,
) -> dict[str, Any]:
    """The stored data of a batch just created (``validating``)."""
    now = int(time.time())
    batch = {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "model": None,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": BatchStatus.validating,
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + parse_window(window),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": usage_object(0, 0),
        "metadata": metadata,
    }
    state = {"next_line": 0, "in_flight": {}, "ending": None, "webhook_url": webhook_url}
    return {"batch": batch, "state": state}


def public_batch(obj: StoredObject) -> dict[str, Any]:
    batch: dict[str, Any] = obj.data["batch"]
    return batch


def usage_object(prompt: int, completion: int) -> dict[str, Any]:
    """OpenAI's usage object of responses and batches."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def output_line(custom_id: str, request_id: str, status: int, body: Any) -> dict[str, Any]:
    response = {"status_code": status, "request_id": f"req_{request_id}", "body": body}
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }


def error_line(custom_id: str, request_id: str, code: str, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


NOT_RUN = {
    BatchStatus.cancelled: "the batch was cancelled before this request finished",
    BatchStatus.expired: "this request could not be executed before the completion window expired",
}


async def cancel_lines(
    store: TaskRecords, tasks: Iterable[Task | None], owner: str, *, running: bool
) -> None:
    """Cancel a batch's queued line tasks, and its running ones with ``running`` (on
    expiry); a line that ended meanwhile is left as it ended."""
    for task in tasks:
        if task is not None and (
            task.status == TaskStatus.pending or (running and not is_terminal(task.status))
        ):
            with contextlib.suppress(AdmissionError):
                await admission.cancel_task(store, task.id, owner)
