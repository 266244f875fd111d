"""OpenAI's chat completion on a task: a request (``POST /v1/chat/completions``, or a batch
line's body) becomes a task, a task that ended becomes the ``chat.completion``.

- ``choices[0]`` is the fused answer (the text of the sample the vote chose); with
  ``n`` > 1 the other choices are the other finished samples (when early stopping left
  fewer than ``n``, they are reused in turn).
- ``stop`` is passed to the engine, and each choice is cut at the first stop sequence.
- a ``ponder`` field carries the task's ``result`` (plus ``task_id`` and ``status``).
- ``response_format`` (``json_schema``, ``json_object``; ``text`` is none) is the task's:
  ``choices[0].message.content`` is then the result's object as JSON text (the other
  choices: each sample's object, or its text where it had none), never cut at a stop.
- ``usage.prompt_tokens`` counts the prompt once whatever ``n`` and the mode;
  ``completion_tokens`` counts every sample's tokens (the work done for the answer).
- ``model`` names the model that answers (a name ``GET /v1/models`` lists; the task's
  ``model`` is the configured model it stands for); the answer's ``model`` is the name
  asked for (an alias's: the name it maps to). ``queue_timeout_s`` (an extension, as
  ``mode``) bounds the task's wait for a worker.

The route, its streaming and waiting are :mod:`ponder.api.openai_compat`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ponder.config import Settings
from ponder.openai.common import (
    OpenAIError,
    answer_text,
    invalid,
    mode_of,
    openai_usage,
    ponder_field,
    response_format_of,
    served_model,
    task_request,
    text_of,
)
from ponder.schemas import ModeField, TaskCreate, TaskTypeField
from ponder.types import Sample, SampleStatus, Task, TaskType

__all__ = [
    "ChatCompletionRequest",
    "chat_body",
    "completion_body",
    "completion_choices",
    "completion_usage",
]

_MAX_STOP = 4


class ChatCompletionRequest(BaseModel):
    """The fields of OpenAI's chat completion request that ponder reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="ponder", max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: Any = None
    # ponder's extensions (the OpenAI SDK's ``extra_body``)
    mode: ModeField | None = None
    task_type: TaskTypeField = TaskType.auto
    priority: int = Field(default=3, ge=0, le=5)
    timeout_s: float | None = Field(default=None, gt=0)
    queue_timeout_s: float | None = Field(default=None, gt=0)
    target_confidence: float | None = Field(default=None, gt=0, le=1)
    max_samples: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def selected_mode(self) -> str:
        return mode_of(self.model, self.mode)


# --- request → task -------------------------------------------------------------------
def chat_body(body: dict[str, Any], settings: Settings, prefix: str = "") -> tuple[
    ChatCompletionRequest, TaskCreate
]:  # fmt: skip
    """A chat completion request body as the request and its task (OpenAI's errors;
    ``prefix``: where the body sits, for error messages, e.g. in a batch line)."""
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise invalid(e, prefix) from e
    req.model = served_model(req.model, settings, f"{prefix}model")
    mode = settings.mode(req.selected_mode())
    if req.n > mode.max_samples:
        raise OpenAIError(
            422,
            "invalid",
            f"{prefix}n: {req.n} is over the {req.selected_mode()} mode's maximum "
            f"{mode.max_samples}",
            param=f"{prefix}n",
        )
    if len(req.stops()) > _MAX_STOP:
        raise OpenAIError(
            422, "invalid", f"{prefix}stop: at most {_MAX_STOP} sequences", param=f"{prefix}stop"
        )
    messages = []
    for i, message in enumerate(req.messages):
        content = text_of(message.get("content"), f"{prefix}messages[{i}].content")
        entry = {"role": message.get("role"), "content": content}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        messages.append(entry)
    fields = {
        "messages": messages,
        "model": req.model,
        "mode": req.selected_mode(),
        "task_type": req.task_type,
        "priority": req.priority,
        "samples": max(req.n, mode.samples) if req.n > 1 else None,
        "max_new_tokens": req.max_completion_tokens or req.max_tokens,
        "temperature": req.temperature,
        "timeout_s": req.timeout_s,
        "queue_timeout_s": req.queue_timeout_s,
        "target_confidence": req.target_confidence,
        "max_samples": req.max_samples,
        "max_total_tokens": req.max_total_tokens,
        "stop": req.stops(),
        "response_format": response_format_of(req.response_format, f"{prefix}response_format"),
    }
    return req, task_request(fields, prefix)


# --- task → completion ----------------------------------------------------------------
def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def completion_choices(task: Task, n: int, stops: list[str]) -> list[dict[str, Any]]:
    """The fused answer first, then the other finished samples (reused when too few)."""
    assert task.result is not None
    done = [s for s in task.samples if s.status == SampleStatus.done and s.text is not None]
    chosen = next((s for s in done if s.index == task.result.chosen_sample), None)
    order: list[Sample | None] = [chosen] + [s for s in done if s is not chosen]
    choices = []
    structured = task.response_format is not None
    for i in range(n):
        sample = order[i % len(order)]
        if i == 0 and structured:
            text, stopped = answer_text(task), False  # the object: never cut
        elif sample is not None and sample.object is not None:
            text, stopped = json.dumps(sample.object, ensure_ascii=False), False
        else:
            text = task.result.text if sample is None else sample.text or ""
            text, stopped = _cut(text, stops)
        finish = sample.finish_reason if sample is not None else "stop"
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "length" if finish == "length" and not stopped else "stop",
                "logprobs": None,
            }
        )
    return choices


def completion_usage(task: Task) -> dict[str, int]:
    """The ``usage`` of a task's completion (:func:`~ponder.openai.common.openai_usage`)."""
    prompt, completion = openai_usage(task)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(task: Task, req: ChatCompletionRequest) -> dict[str, Any]:
    """The ``chat.completion`` of a task that has a result."""
    return {
        "id": f"chatcmpl-{task.id}",
        "object": "chat.completion",
        "created": int(task.created_at.timestamp()),
        "model": req.model,
        "choices": completion_choices(task, req.n, req.stops()),
        "usage": completion_usage(task),
        "system_fingerprint": None,
        "ponder": ponder_field(task),
    }
