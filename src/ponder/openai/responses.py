"""OpenAI's Responses API on a task: a request (``POST /v1/responses``, or a batch line's
body) becomes a task and the response's own fields, a task becomes the response object,
and its event log the response's stream events.

A response is a task: ``resp_<task id>``. Its status maps from the task's: ``pending`` →
``queued``, ``running`` → ``in_progress``, ``done`` → ``completed``, ``partial_done`` →
``incomplete`` (``incomplete_details.reason``: ``partial_samples``), ``failed`` →
``failed`` (``error``), ``cancelled`` → ``cancelled``, ``expired`` (not started within its
``queue_timeout_s``) → ``failed`` with ``error.code`` ``queue_timeout``. ``output`` is the
fused answer as one assistant message, ``usage`` counts the prompt once and every sample's
output tokens (:func:`~ponder.openai.common.openai_usage`), and a ``ponder`` field carries
the vote (as on the chat route). ``text.format`` (``json_schema`` with its ``name``, ``schema``,
``strict`` beside ``type``, or ``json_object``) is the task's ``response_format``: the
output text is then the result's object as JSON text, and the response echoes the format.
The routes are :mod:`ponder.api.responses`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ponder.config import Settings
from ponder.openai.batches import usage_object
from ponder.openai.common import (
    OpenAIError,
    answer_text,
    check_metadata,
    invalid,
    mode_of,
    openai_usage,
    ponder_field,
    response_format_of,
    served_model,
    task_request,
    text_of,
)
from ponder.schemas import ModeField, ResponseFormatBody, TaskCreate, TaskTypeField
from ponder.states import is_terminal
from ponder.store.base import Event
from ponder.types import EventName, Task, TaskStatus, TaskType

__all__ = [
    "KIND",
    "QUEUE_TIMEOUT",
    "ResponseCreateRequest",
    "ResponseEvents",
    "parse_response_body",
    "response_object",
]

KIND = "response"
#: ``error.code`` of a response whose task expired in the queue
QUEUE_TIMEOUT = "queue_timeout"
_ROLES = frozenset({"user", "system", "developer", "assistant"})

STATUS = {
    TaskStatus.pending: "queued",
    TaskStatus.running: "in_progress",
    TaskStatus.done: "completed",
    TaskStatus.partial_done: "incomplete",
    TaskStatus.failed: "failed",
    TaskStatus.cancelled: "cancelled",
    TaskStatus.expired: "failed",
}
#: the stream's last event for each terminal status
_TERMINAL_EVENTS = {
    TaskStatus.done: "response.completed",
    TaskStatus.partial_done: "response.incomplete",
    TaskStatus.failed: "response.failed",
    TaskStatus.cancelled: "response.cancelled",
    TaskStatus.expired: "response.failed",
}


class ResponseCreateRequest(BaseModel):
    """The fields of OpenAI's response request that ponder reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="ponder", max_length=200)
    input: str | list[Any]
    instructions: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    background: bool = False
    stream: bool = False
    store: bool = True
    tools: list[Any] | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    # ponder's extensions (the OpenAI SDK's ``extra_body``)
    mode: ModeField | None = None
    task_type: TaskTypeField = TaskType.auto
    priority: int = Field(default=3, ge=0, le=5)
    samples: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    queue_timeout_s: float | None = Field(default=None, gt=0)
    target_confidence: float | None = Field(default=None, gt=0, le=1)
    max_samples: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    webhook_url: str | None = Field(default=None, max_length=2000)

    _metadata = field_validator("metadata")(check_metadata)


# --- request → task -------------------------------------------------------------------
def _input_items(req: ResponseCreateRequest, task_id: str, prefix: str) -> list[dict[str, Any]]:
    """The input as OpenAI's input message items (what ``input_items`` lists)."""
    if isinstance(req.input, str):
        raw: list[Any] = [{"role": "user", "content": req.input}]
    else:
        raw = req.input
    if not raw:
        raise OpenAIError(
            422, "invalid", f"{prefix}input: give at least one message", param=f"{prefix}input"
        )
    items = []
    for i, item in enumerate(raw):
        where = f"{prefix}input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind != "message" or item.get("role") not in _ROLES:
            raise OpenAIError(
                422,
                "invalid",
                f"{where}: only messages with a role of {', '.join(sorted(_ROLES))} are "
                f"supported, not {kind!r}",
                param=where,
            )
        role = item["role"]
        text = text_of(item.get("content"), f"{where}.content")
        part = "output_text" if role == "assistant" else "input_text"
        items.append(
            {
                "type": "message",
                "id": f"msg_{task_id}_{i}",
                "role": role,
                "status": "completed",
                "content": [{"type": part, "text": text}],
            }
        )
    return items


def _refuse_unsupported(req: ResponseCreateRequest, prefix: str) -> None:
    """422 for what a response request may ask that ponder does not do."""
    refusals = (
        (bool(req.tools), "tools", "tools are not supported"),
        (
            req.previous_response_id is not None,
            "previous_response_id",
            "not supported; send the conversation in input",
        ),
        (req.background and not req.store, "store", "background responses need store"),
    )
    for refused, field, why in refusals:
        if refused:
            raise OpenAIError(422, "invalid", f"{prefix}{field}: {why}", param=f"{prefix}{field}")


def parse_response_body(
    body: dict[str, Any], settings: Settings, task_id: str, prefix: str = ""
) -> tuple[ResponseCreateRequest, dict[str, Any], TaskCreate]:
    """A response request body as the request, the response's own fields (``meta``,
    what the response object echoes) and the task to run. Errors in OpenAI's shape;
    ``prefix`` says where the body sits (a batch line's ``body.``)."""
    try:
        req = ResponseCreateRequest.model_validate(body)
    except ValidationError as e:
        raise invalid(e, prefix) from e
    req.model = served_model(req.model, settings, f"{prefix}model")
    _refuse_unsupported(req, prefix)
    items = _input_items(req, task_id, prefix)
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += [{"role": i["role"], "content": i["content"][0]["text"]} for i in items]
    mode = mode_of(req.model, req.mode)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    text_format = _text_format(req, prefix)
    fields = {
        "messages": messages,
        "model": req.model,
        "mode": mode,
        "task_type": req.task_type,
        "priority": req.priority,
        "samples": req.samples,
        "max_new_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "timeout_s": req.timeout_s,
        "queue_timeout_s": req.queue_timeout_s,
        "target_confidence": req.target_confidence,
        "max_samples": req.max_samples,
        "max_total_tokens": req.max_total_tokens,
        "stop": [s for s in stops if s],
        "metadata": req.metadata,
        "response_format": text_format,
    }
    meta = {
        "model": req.model,
        "instructions": req.instructions,
        "input": items,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "background": req.background,
        "store": req.store,
        "webhook_url": (req.webhook_url or settings.webhook_url) if req.background else None,
        "text": {"format": _echoed(text_format)},
    }
    return req, meta, task_request(fields, prefix)


def _text_format(req: ResponseCreateRequest, prefix: str) -> ResponseFormatBody | None:
    """The task's ``response_format`` of the request's ``text.format`` (None: prose)."""
    return response_format_of((req.text or {}).get("format"), f"{prefix}text.format", flat=True)


def _echoed(text_format: ResponseFormatBody | None) -> dict[str, Any]:
    """``text.format`` as the response object shows it (the Responses API's flat shape)."""
    if text_format is None:
        return {"type": "text"}
    if text_format.json_schema is None:
        return {"type": text_format.type}
    return {"type": text_format.type, **text_format.json_schema.model_dump(by_alias=True)}


# --- task → response ------------------------------------------------------------------
def _message(task: Task, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": f"msg_{task.id}",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(
    meta: dict[str, Any], task: Task, *, as_of: TaskStatus | None = None
) -> dict[str, Any]:
    """The response object of ``task``; ``as_of``: as it was while the task had that
    (non-terminal) status (a stream's snapshots: they never show later state)."""
    status = as_of or task.status
    final = is_terminal(status)
    error = None
    if final and status == TaskStatus.failed:
        code, message = (task.error.code, task.error.message) if task.error else ("failed", "")
        error = {"code": "server_error", "message": f"{code}: {message}"}
    elif final and status == TaskStatus.expired:
        message = task.error.message if task.error else "not started within its queue_timeout_s"
        error = {"code": QUEUE_TIMEOUT, "message": message}
    answered = final and task.result is not None
    finished = task.finished_at if final else None
    return {
        "id": f"resp_{task.id}",
        "object": "response",
        "created_at": int(task.created_at.timestamp()),
        "status": STATUS[status],
        "background": meta["background"],
        "completed_at": int(finished.timestamp()) if finished and answered else None,
        "error": error,
        "incomplete_details": {"reason": "partial_samples"}
        if status == TaskStatus.partial_done
        else None,
        "instructions": meta["instructions"],
        "max_output_tokens": meta["max_output_tokens"],
        "metadata": meta["metadata"],
        "model": meta["model"],
        "output": [_message(task, "completed", answer_text(task))]
        if answered and task.result is not None
        else [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": meta["store"],
        "temperature": task.temperature,
        "text": meta.get("text") or {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": meta["top_p"] if meta["top_p"] is not None else 1.0,
        "truncation": "disabled",
        "usage": usage_object(*openai_usage(task)) if final else None,
        "user": None,
        "ponder": ponder_field(task) if final else {"task_id": task.id, "status": status.value},
    }


class ResponseEvents:
    """Maps a task's event log to OpenAI's response stream events.

    The mapping is a pure function of the log (and of the response's own fields), and
    every event gets the next ``sequence_number``: replaying the log gives the same events
    with the same numbers, which is what resuming with ``starting_after`` relies on.

    - ``status`` pending → ``response.created`` + ``response.queued``; running →
      ``response.in_progress`` (once; a reclaimed task's second start adds nothing).
    - ``sample`` → ``ponder.sample``, ``preliminary`` → ``ponder.preliminary``.
    - ``delta`` (``{"index": i, "text": …}``, per-token text of sample i): the output's
      ``response.output_text.delta`` when the task runs one sample (that sample is the
      answer) and is not structured (its answer is the voted object), else
      ``ponder.sample.delta``.
    - the terminal event → the rest of the output message (one delta with the text not
      yet sent, ``.done`` events) and ``response.completed`` / ``incomplete`` /
      ``failed`` / ``cancelled`` with the whole response.
    """

    def __init__(self, meta: dict[str, Any], task: Task) -> None:
        self.meta = meta
        self.task = task
        self.seq = 0
        self._running = False
        self._opened = False
        self._sent = ""  # output text sent so far
        # one sample's text is the answer, unless the answer is a structured task's object
        self._single = task.samples_planned == 1 and task.response_format is None

    def _emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _where(self) -> dict[str, Any]:
        return {"item_id": f"msg_{self.task.id}", "output_index": 0, "content_index": 0}

    def _open(self) -> list[dict[str, Any]]:
        if self._opened:
            return []
        self._opened = True
        item = _message(self.task, "in_progress", None)
        return [
            self._emit("response.output_item.added", output_index=0, item=item),
            self._emit("response.content_part.added", **self._where(), part=_text_part("")),
        ]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        self._sent += text
        return [self._emit("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def map(self, event: Event, final: Task | None = None) -> list[dict[str, Any]]:
        """The response events of one task event; ``final``: the ended task, given with
        the terminal event."""
        data = event.data
        if final is not None:
            return self._finish(final)
        if event.event == EventName.status and data.get("status") == TaskStatus.pending:
            snapshot = response_object(self.meta, self.task, as_of=TaskStatus.pending)
            return [
                self._emit("response.created", response=snapshot),
                self._emit("response.queued", response=snapshot),
            ]
        if event.event == EventName.status and data.get("status") == TaskStatus.running:
            if self._running:
                return []
            self._running = True
            snapshot = response_object(self.meta, self.task, as_of=TaskStatus.running)
            return [self._emit("response.in_progress", response=snapshot)]
        if event.event == EventName.sample:
            return [self._emit("ponder.sample", sample=data)]
        if event.event == EventName.preliminary:
            return [self._emit("ponder.preliminary", result=data)]
        if event.event == EventName.delta:
            text = str(data.get("text", ""))
            if self._single:
                return self._open() + self._delta(text)
            return [self._emit("ponder.sample.delta", sample_index=data.get("index"), delta=text)]
        return []

    def _finish(self, task: Task) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if task.result is not None:
            text = answer_text(task)
            out += self._open()
            if not self._sent or (text.startswith(self._sent) and text != self._sent):
                out += self._delta(text[len(self._sent) :])
            out.append(
                self._emit("response.output_text.done", **self._where(), text=text, logprobs=[])
            )
            out.append(
                self._emit("response.content_part.done", **self._where(), part=_text_part(text))
            )
            out.append(
                self._emit(
                    "response.output_item.done",
                    output_index=0,
                    item=_message(task, "completed", text),
                )
            )
        kind = _TERMINAL_EVENTS[task.status]
        return [*out, self._emit(kind, response=response_object(self.meta, task))]
