"""The domain model: Task, Sample, Result and the request that creates a task.

These are the shapes of API.md; a field may be added, never renamed or removed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DEFAULT_MODE",
    "CallbackInfo",
    "Delivery",
    "EventName",
    "FieldVote",
    "JsonSchemaFormat",
    "Mode",
    "ReasoningPath",
    "ResponseFormat",
    "Result",
    "Sample",
    "SampleStatus",
    "Task",
    "TaskError",
    "TaskStatus",
    "TaskType",
    "Tokens",
    "Usage",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


class TaskStatus(StrEnum):
    pending = "pending"
    running = "running"
    done = "done"
    partial_done = "partial_done"
    failed = "failed"
    cancelled = "cancelled"
    #: not started within its ``queue_timeout_s``: it never ran
    expired = "expired"


class SampleStatus(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"
    timeout = "timeout"
    error = "error"
    cancelled = "cancelled"
    skipped = "skipped"


class Mode(StrEnum):
    """How hard a task thinks: its samples, paths and limits (``Settings.modes``)."""

    fast = "fast"
    standard = "standard"
    deep = "deep"
    #: a cascade: one greedy answer, then a second reasoning path, then the rest of the deep
    #: plan, each stage only while the calibrated confidence is below the target
    auto = "auto"


#: the mode of a request that names none (the task API, the OpenAI model ``ponder``, the
#: SDK, the CLI and the console)
DEFAULT_MODE = Mode.standard


class EventName(StrEnum):
    """The kinds of event in a task's event log (SSE ``event:``, WebSocket ``event``)."""

    #: the task's status changed (``{"status": …}``)
    status = "status"
    #: a sample ended (the Sample)
    sample = "sample"
    #: the vote so far, while samples still run (a Result)
    preliminary = "preliminary"
    #: text a running sample generated (``{"index", "offset", "text"}``: ponder.deltas)
    delta = "delta"
    #: the task ended (the whole task, with its result)
    result = "result"


class ReasoningPath(StrEnum):
    """How a sample reasons (``Sample.path``; a mode's ``paths`` spread its samples)."""

    #: chain of thought: step by step, ending with the answer
    cot = "cot"
    #: the problem broken into sub-questions answered in turn, then combined
    decompose = "decompose"
    #: program of thought (math): a Python program, run in the sandbox, prints the answer
    pot = "pot"


class TaskType(StrEnum):
    auto = "auto"
    math = "math"
    code = "code"
    choice = "choice"
    text = "text"


class Tokens(BaseModel):
    prompt: int = 0
    completion: int = 0


class TaskError(BaseModel):
    code: str
    message: str


class Sample(BaseModel):
    index: int
    path: ReasoningPath = ReasoningPath.cot
    temperature: float
    seed: int
    status: SampleStatus = SampleStatus.queued
    text: str | None = None
    answer: str | None = None
    confidence: float | None = None
    tokens: Tokens = Field(default_factory=Tokens)
    latency_ms: int | None = None
    error: TaskError | None = None
    finish_reason: str | None = None
    mean_logprob: float | None = None
    #: program-of-thought: what the sample's program printed
    program_output: str | None = None
    #: code tasks with tests: how many tests the candidate passed / failed
    tests_passed: int | None = None
    tests_failed: int | None = None
    #: the sandbox that ran the sample's program or tests: ``bwrap`` (namespaces) or
    #: ``rlimits`` (best effort); None when nothing ran
    isolation: Literal["bwrap", "rlimits"] | None = None
    #: a structured task (``response_format``): the sample's output parsed as JSON when it
    #: is valid for the schema (it votes), else None and ``schema_error`` says why
    object: dict[str, Any] | None = None
    schema_error: str | None = None
    #: the model that ran the sample (a task escalated to a stronger model keeps the
    #: samples of the one before, which do not vote in its result)
    model: str | None = None


class FieldVote(BaseModel):
    """One leaf of a structured result: the value voted for it, the votes each value got
    (by its display), the winner's share of the valid samples and the calibrated
    probability that it is right."""

    value: Any
    votes: dict[str, int]
    agreement: float
    confidence: float


class Result(BaseModel):
    answer: str | None
    text: str
    confidence: float
    agreement: float
    votes: dict[str, int]
    chosen_sample: int
    reasoning: str | None = None
    clarification: str | None = None
    #: samples the stop rule skipped, and their estimated completion tokens (auto mode:
    #: against the deep plan it would have run in full)
    samples_saved: int = 0
    tokens_saved: int = 0
    #: auto mode: the stage the task ended in (1: the greedy answer, 2: a second reasoning
    #: path, 3: the rest of the deep plan) and the escalations taken to get there
    stage: int | None = None
    escalations: list[str] = Field(default_factory=list)
    #: why sampling ended: ``confident`` (the confidence reached the target), ``decided``
    #: (the samples left could not change the leader), ``budget`` (``max_samples`` or
    #: ``max_total_tokens`` ended it with the best answer so far), ``complete`` (every
    #: planned sample ran), ``deadline`` (the task's time ran out); None while running
    stop_reason: Literal["confident", "decided", "budget", "complete", "deadline"] | None = None
    #: a structured task: the answer as a JSON object (``answer`` holds its JSON text),
    #: each leaf's vote by its path (``customer.name``, ``items[0].price``), and how the
    #: object was made: ``fields`` (leaf by leaf) or ``sample`` (the best whole valid
    #: sample, where the leaf-wise object would not validate); None otherwise
    object: dict[str, Any] | None = None
    fields: dict[str, FieldVote] | None = None
    object_from: Literal["fields", "sample"] | None = None
    #: the model whose samples voted for this result
    model: str | None = None
    #: auto mode: the model the task continued on when its own last stage ended below the
    #: target (``escalate_to`` in the models file); None when it did not escalate
    escalated_to: str | None = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Delivery(BaseModel):
    event: str
    attempts: int = 0
    status_code: int | None = None
    webhook_id: str | None = None
    delivered: bool = False
    error: str | None = None


class CallbackInfo(BaseModel):
    url: str
    deliveries: list[Delivery] = Field(default_factory=list)


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``, as OpenAI's chat API takes it. A request's schema
    is checked against the supported subset once, on the way in
    (:class:`ponder.schemas.JsonSchemaBody`); a stored task is read without checking it
    again."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(default=None, max_length=2000)
    #: the JSON Schema (``schema`` on the wire: the attribute name is BaseModel's)
    schema_: dict[str, Any] = Field(alias="schema")
    #: ask the engine to constrain decoding to the schema (docs/structured.md: which can)
    strict: bool = False


class ResponseFormat(BaseModel):
    """A task's output format: ``{"type": "json_schema", "json_schema": {...}}`` (an
    object valid for that schema) or ``{"type": "json_object"}`` (any JSON object)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema", "json_object"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('give "json_schema" with "type": "json_schema" (and only then)')
        return self

    def answer_schema(self) -> dict[str, Any]:
        """The schema every answer must be valid for (any object for ``json_object``)."""
        return self.json_schema.schema_ if self.json_schema is not None else {"type": "object"}

    @property
    def strict(self) -> bool:
        """Whether the caller asked for decoding constrained to the schema."""
        return self.json_schema is not None and self.json_schema.strict


class Task(BaseModel):
    """A task as stored and as returned by the API."""

    model_config = ConfigDict(use_enum_values=False)

    id: str
    status: TaskStatus = TaskStatus.pending
    mode: Mode = DEFAULT_MODE
    task_type: TaskType = TaskType.auto
    priority: int = 3
    #: the model that runs the task (its queue): the one asked for, or, after an
    #: escalation, the stronger model it continued on (``result.escalated_to``)
    model: str = "ponder"
    #: a task not started this many seconds after ``created_at`` ends ``expired``
    #: (None: no limit)
    queue_timeout_s: float | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    samples_planned: int = 0
    samples_done: int = 0
    #: samples that ran (finished, failed or timed out); fewer than planned after early stop
    samples_used: int = 0
    samples: list[Sample] = Field(default_factory=list)
    preliminary: Result | None = None
    result: Result | None = None
    error: TaskError | None = None
    usage: Usage = Field(default_factory=Usage)
    callback: CallbackInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # --- what the worker needs to run it (part of the Task body too: clients see what ran)
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_new_tokens: int = 0
    temperature: float = 0.0
    timeout_s: float = 0.0
    sample_timeout_s: float = 0.0
    tests: str | None = None
    #: None: the mode's setting
    early_stop: bool | None = None
    #: stop sampling once the leader stays the leader with this probability; None: the mode's
    target_confidence: float | None = None
    #: stop sequences passed to the engine
    stop: list[str] = Field(default_factory=list)
    #: the budget: at most this many samples, and completion tokens over all of them
    #: (None: no budget beyond the plan and max_new_tokens per sample)
    max_samples: int | None = None
    max_total_tokens: int | None = None
    #: a structured task: the JSON its answers must be (docs/structured.md); None: prose
    response_format: ResponseFormat | None = None
    attempts: int = 0

    # --- never shown to clients
    owner: str = Field(default="", exclude=True)
    #: the record's revision: the stores write a task only over the revision it was read at
    rev: int = Field(default=0, exclude=True)

    def to_public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_public_json(self) -> str:
        """:meth:`to_public` as JSON text, serialized by pydantic directly (the API's
        task responses: a dict through FastAPI's encoder costs several times more)."""
        return self.model_dump_json()

    def to_storage(self, rev: int | None = None) -> str:
        """The JSON stored by the stores: :meth:`to_public_json` plus the owner and the
        revision (``rev``, default the task's own), serialized in one pass."""
        public = self.to_public_json()
        rev = self.rev if rev is None else rev
        return f'{public[:-1]},"owner":{json.dumps(self.owner)},"rev":{rev}}}'

    @classmethod
    def from_storage(cls, raw: str | bytes) -> Task:
        return cls.model_validate_json(raw)
