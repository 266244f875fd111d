"""The SDK without its I/O: what :class:`ponder.client.Client` and
:class:`~ponder.client.AsyncClient` share, written once.

Here are the errors and models the SDK returns, the requests of each method
(:class:`Request`, built and checked before anything is sent), the retry policy
(:meth:`ClientCore._settle`: which answers and failures are retried, and after how long),
the event-stream parser and its resume state (:class:`EventStream`: the ``Last-Event-ID``
to send, when the stream is over, when to reconnect). Nothing here sends, receives or
sleeps: the two clients do that, each in its own way, and nothing else.

Import the public names from :mod:`ponder.client`.
"""

from __future__ import annotations

import inspect
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import httpx
from pydantic import ValidationError

from ponder.config import client_environment
from ponder.errors import ConfigError, PonderError
from ponder.schemas import TaskCreate, describe_errors
from ponder.states import STATUS_EVENTS, is_final
from ponder.types import (
    EventName,
    Mode,
    ResponseFormat,
    Result,
    Sample,
    Task,
    TaskStatus,
    TaskType,
)
from ponder.version import __version__

DEFAULT_URL = "http://127.0.0.1:8000"
#: the API error codes that are retried (and reconnected, on an event stream)
RETRY_CODES = frozenset({"queue_full", "rate_limited", "unavailable"})
_BACKOFF_BASE_S = 0.25
_BACKOFF_MAX_S = 8.0
#: longest silence on an event stream before it is taken as dead (the server sends a
#: keep-alive comment every 15 s by default)
_IDLE_TIMEOUT_S = 60.0
_MAX_RECONNECTS = 8


# --- errors ---------------------------------------------------------------------------
class APIError(PonderError):
    """A non-2xx answer: ``status_code``, the API error ``code`` and ``message``."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        body: Any = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.body = body
        #: the server's Retry-After, where it sent one
        self.retry_after_s = retry_after_s


class BadRequestError(APIError):
    """400 ``bad_request``: the body is not valid JSON."""


class AuthenticationError(APIError):
    """401 ``unauthorized``: the API key is missing or wrong."""


class NotFoundError(APIError):
    """404 ``not_found``: unknown task id, or another key's task."""


class ConflictError(APIError):
    """409 ``conflict``: e.g. cancel of a finished task (``task`` holds it)."""

    @property
    def task(self) -> Task | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("task"), dict):
            return Task.model_validate(self.body["task"])
        return None


class TooLargeError(APIError):
    """413 ``too_large``: the body or prompt is over the limit."""


class InvalidRequestError(APIError):
    """422 ``invalid``: a field fails validation (the message names it)."""


class RateLimitError(APIError):
    """429 ``rate_limited``: the key's rate limit was hit (retried by default)."""


class QueueFullError(APIError):
    """503 ``queue_full``: the backlog is at its limit (retried by default)."""


class UnavailableError(APIError):
    """503 ``unavailable``: the service's store cannot be reached (retried by default)."""


class InternalServerError(APIError):
    """500 and other server failures."""


class APIConnectionError(PonderError):
    """The service could not be reached (after the retries)."""


class WaitTimeout(PonderError, TimeoutError):
    """``wait``/``events`` ran past their timeout; the task goes on."""


_ERRORS: dict[str, type[APIError]] = {
    "bad_request": BadRequestError,
    "unauthorized": AuthenticationError,
    "not_found": NotFoundError,
    "model_not_found": NotFoundError,
    "conflict": ConflictError,
    "too_large": TooLargeError,
    "invalid": InvalidRequestError,
    "rate_limited": RateLimitError,
    "queue_full": QueueFullError,
    "unavailable": UnavailableError,
}


def _retry_after_s(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def error_from_response(response: httpx.Response) -> APIError:
    """The typed exception of a non-2xx answer (the API's envelope, or its status)."""
    try:
        body: Any = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        body = response.text[:1000]
        code = "internal" if response.status_code >= 500 else "bad_request"
        message = body or response.reason_phrase
    cls = _ERRORS.get(code, InternalServerError if response.status_code >= 500 else APIError)
    return cls(response.status_code, code, message, body, retry_after_s=_retry_after_s(response))


# --- models ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TextDelta:
    """New text of a running sample: ``text`` goes at character ``offset`` of sample
    ``index``'s text (a sample rerun from its start begins again at offset 0)."""

    index: int
    offset: int
    text: str

    def apply(self, text_so_far: str) -> str:
        """The sample's text with this piece in place."""
        return text_so_far[: self.offset] + self.text


@dataclass(frozen=True)
class TaskEvent:
    """One event of a task's stream: ``status``, ``delta``, ``sample``, ``preliminary`` or
    ``result``."""

    id: str
    event: str
    data: dict[str, Any]

    @property
    def is_final(self) -> bool:
        """True for the event that carries a terminal status (the stream's last)."""
        return is_final(self)

    @property
    def status(self) -> TaskStatus | None:
        """The task status a ``status`` or ``result`` event carries."""
        if self.event in STATUS_EVENTS and "status" in self.data:
            return TaskStatus(self.data["status"])
        return None

    @property
    def task(self) -> Task | None:
        """The whole task, carried by the ``result`` event."""
        return Task.model_validate(self.data) if self.event == EventName.result else None

    @property
    def sample(self) -> Sample | None:
        """The finished sample of a ``sample`` event."""
        return Sample.model_validate(self.data) if self.event == EventName.sample else None

    @property
    def result(self) -> Result | None:
        """The early answer of a ``preliminary`` event."""
        return Result.model_validate(self.data) if self.event == EventName.preliminary else None

    @property
    def delta(self) -> TextDelta | None:
        """The new text of a running sample, carried by a ``delta`` event."""
        if self.event != EventName.delta:
            return None
        return TextDelta(int(self.data["index"]), int(self.data["offset"]), str(self.data["text"]))


@dataclass
class TaskPage:
    """One page of ``list``: newest first; pass ``next_cursor`` back for the next."""

    data: list[Task] = field(default_factory=list)
    next_cursor: str | None = None


def task_of(response: httpx.Response) -> Task:
    """The task a (2xx) answer carries."""
    return Task.model_validate(response.json())


def page_of(response: httpx.Response) -> TaskPage:
    """The page of tasks a (2xx) answer of ``GET /v1/tasks`` carries."""
    body = response.json()
    return TaskPage(
        data=[Task.model_validate(t) for t in body["data"]], next_cursor=body["next_cursor"]
    )


# --- requests -------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One call of the API, before the client adds its URL and headers: the method, the
    path and httpx's other keyword arguments (``json``, ``params``, ``headers``, …)."""

    method: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)


def submit_request(
    prompt: str | None = None,
    *,
    messages: list[dict[str, Any]] | None = None,
    model: str | None = None,
    mode: Mode | str | None = None,
    task_type: TaskType | str = TaskType.auto,
    priority: int = 3,
    callback_url: str | None = None,
    samples: int | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    timeout_s: float | None = None,
    queue_timeout_s: float | None = None,
    tests: str | None = None,
    stop: list[str] | None = None,
    early_stop: bool | None = None,
    target_confidence: float | None = None,
    max_samples: int | None = None,
    max_total_tokens: int | None = None,
    metadata: dict[str, Any] | None = None,
    response_format: ResponseFormat | dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Request:
    """Submit a task (``POST /v1/tasks``); returns it, ``pending``.

    ``model``: a name ``GET /v1/models`` lists (default: the service's default model;
    unknown: :class:`NotFoundError`); ``mode`` defaults to the name's (``NAME-deep``),
    else standard. ``queue_timeout_s``: not started by then, the task ends ``expired``.

    ``response_format`` asks for a structured answer (docs/structured.md): a
    :class:`~ponder.types.ResponseFormat` or its JSON (``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}`` or ``{"type": "json_object"}``); the
    result's ``object`` is then the answer as a JSON object, ``fields`` each leaf's vote.

    Raises :class:`InvalidRequestError` without sending when the request is invalid (a
    schema outside the supported subset included: the message names the part).
    """
    if isinstance(response_format, ResponseFormat):
        response_format = response_format.model_dump(mode="json", exclude_none=True)
    fields = {
        "prompt": prompt, "messages": messages, "model": model, "mode": mode,
        "task_type": task_type, "queue_timeout_s": queue_timeout_s,
        "priority": priority, "callback_url": callback_url, "samples": samples,
        "max_new_tokens": max_new_tokens, "temperature": temperature, "timeout_s": timeout_s,
        "tests": tests, "stop": stop, "early_stop": early_stop,
        "target_confidence": target_confidence, "max_samples": max_samples,
        "max_total_tokens": max_total_tokens, "metadata": metadata,
        "response_format": response_format,
    }  # fmt: skip
    # checked as the API checks it: the same model (no coercion, no NaN, no blank prompt)
    body = {k: v for k, v in fields.items() if v is not None}
    try:
        TaskCreate.model_validate(body)
    except ValidationError as e:
        raise InvalidRequestError(422, "invalid", describe_errors(e.errors())) from e
    # the same key on every retry: a retry never creates a second task
    key = idempotency_key or f"ponder-sdk-{uuid.uuid4().hex}"
    return Request("POST", "/v1/tasks", {"json": body, "headers": {"Idempotency-Key": key}})


def get_request(task_id: str) -> Request:
    return Request("GET", f"/v1/tasks/{task_id}")


def cancel_request(task_id: str) -> Request:
    return Request("DELETE", f"/v1/tasks/{task_id}")


def list_request(status: TaskStatus | str | None, limit: int, cursor: str | None) -> Request:
    params: dict[str, Any] = {"limit": limit}
    if status is not None:
        params["status"] = TaskStatus(status).value
    if cursor is not None:
        params["cursor"] = cursor
    return Request("GET", "/v1/tasks", {"params": params})


_Self = TypeVar("_Self")
_Params = ParamSpec("_Params")
_Return = TypeVar("_Return")


def takes_request_of(
    build: Callable[_Params, Request],
) -> Callable[
    [Callable[[_Self, Request], _Return]], Callable[Concatenate[_Self, _Params], _Return]
]:
    """Decorate a client method ``method(self, request)``: it is called with the
    parameters of ``build`` (its signature, defaults and docstring) and given the request
    ``build`` makes of them. So a method with many parameters (``submit``) is declared
    once for both clients; an async method stays a coroutine function."""

    def decorate(
        method: Callable[[_Self, Request], _Return],
    ) -> Callable[Concatenate[_Self, _Params], _Return]:
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(method):

            async def wrapper(self: _Self, *args: _Params.args, **kwargs: _Params.kwargs) -> Any:
                # built inside the coroutine: an invalid request raises where it is awaited
                return await cast(Awaitable[Any], method(self, build(*args, **kwargs)))

        else:

            def wrapper(self: _Self, *args: _Params.args, **kwargs: _Params.kwargs) -> Any:
                return method(self, build(*args, **kwargs))

        own, built = inspect.signature(method), inspect.signature(build)
        first = next(iter(own.parameters.values()))  # self
        wrapper.__name__, wrapper.__qualname__ = method.__name__, method.__qualname__
        wrapper.__module__, wrapper.__doc__ = method.__module__, build.__doc__
        wrapper.__annotations__ = {**build.__annotations__, "return": own.return_annotation}
        wrapper.__signature__ = built.replace(  # type: ignore[union-attr]
            parameters=[first, *built.parameters.values()], return_annotation=own.return_annotation
        )
        return cast(Callable[Concatenate[_Self, _Params], _Return], wrapper)

    return decorate


# --- what both clients hold and decide ------------------------------------------------
def _checked_url(base_url: str | None) -> str:
    url = (base_url or client_environment()[0] or DEFAULT_URL).rstrip("/")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"the service URL {url!r} (PONDER_URL) is not an http(s) URL; give e.g. {DEFAULT_URL}"
        )
    return url


_Http = TypeVar("_Http", httpx.Client, httpx.AsyncClient)


class ClientCore(Generic[_Http]):
    """The service, the headers, the retry policy and the HTTP client of a client; no I/O.

    Its methods are private: :class:`~ponder.client.Client` and
    :class:`~ponder.client.AsyncClient` inherit it (each names its ``httpx`` client class),
    and their public methods are the SDK.
    """

    _http_class: type[_Http]

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_retry_wait_s: float = 60.0,
        http_client: _Http | None = None,
    ) -> None:
        self.base_url = _checked_url(base_url)
        key = api_key if api_key is not None else client_environment()[1]
        self.headers = {"user-agent": f"ponder-python/{__version__}"}
        if key:
            if not (key.isascii() and key.isprintable()):
                raise ConfigError(
                    "the API key (PONDER_API_KEY) must be printable ASCII; "
                    "`ponder keys new` makes one"
                )
            self.headers["authorization"] = f"Bearer {key}"
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self._rng = random.Random()
        #: a client given by the caller is theirs to close
        self._owns_http = http_client is None
        self._http: _Http = http_client or self._http_class(timeout=timeout)

    def _args(self, request: Request) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` (or ``.stream``) for ``request``."""
        options = dict(request.options)
        headers = {**self.headers, **options.pop("headers", {})}
        return {
            "method": request.method,
            "url": self.base_url + request.path,
            "headers": headers,
            **options,
        }

    def _delay_s(self, attempt: int, error: Exception) -> float | None:
        """How long to wait before retry ``attempt`` (0-based), or None: do not retry."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, APIError):
            if error.code not in RETRY_CODES:
                return None
            if error.retry_after_s is not None:
                return min(error.retry_after_s, self.max_retry_wait_s)
        backoff = min(_BACKOFF_BASE_S * 2.0**attempt, _BACKOFF_MAX_S)
        return min(backoff * self._rng.uniform(0.5, 1.0), self.max_retry_wait_s)

    def _settle(
        self, attempt: int, outcome: httpx.Response | httpx.TransportError
    ) -> httpx.Response | float:
        """The outcome of attempt ``attempt`` (0-based) of a request: the response when it
        succeeded; else the seconds to wait before the next attempt, or (no retry left, or
        an error that is not retried) its typed error is raised."""
        if isinstance(outcome, httpx.Response):
            if outcome.status_code < 400:
                return outcome
            error: Exception = error_from_response(outcome)
        else:
            error = APIConnectionError(f"cannot reach {self.base_url}: {outcome!r}")
            error.__cause__ = outcome
        delay = self._delay_s(attempt, error)
        if delay is None:
            raise error
        return delay

    def _reconnect_delay_s(self, failures: int, error: Exception) -> float:
        """The wait before reconnecting an event stream: Retry-After, else a backoff."""
        if isinstance(error, APIError) and error.retry_after_s is not None:
            return min(error.retry_after_s, self.max_retry_wait_s)
        backoff = min(_BACKOFF_BASE_S * 2.0 ** (failures - 1), _BACKOFF_MAX_S)
        return backoff * self._rng.uniform(0.5, 1.0)


# --- event streams --------------------------------------------------------------------
class _SSEParser:
    """Server-Sent Events from lines (comments and ``retry:`` ignored)."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> TaskEvent | None:
        if not line:
            if not self._data:
                self._event = "message"
                return None
            event = TaskEvent(self._id or "", self._event, json.loads("\n".join(self._data)))
            self._event, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class EventStream:
    """The state of one ``events`` call over its connections: the request of each
    connection (resuming after the last event seen, with ``Last-Event-ID``: no event is
    missed or repeated), the events parsed from its lines, when the stream is over, and
    when and after how long to reconnect. The client opens the connections, reads their
    lines, fetches the task when a stream ends quietly, and sleeps."""

    def __init__(
        self,
        core: ClientCore[Any],
        task_id: str,
        *,
        last_event_id: str | None,
        timeout: float | None,
        deltas: bool,
    ) -> None:
        self._core = core
        self.task_id = task_id
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._params = {} if deltas else {"deltas": "false"}
        #: the id of the last event received: the next connection resumes after it
        self.after = last_event_id
        self._failures = 0
        self._got_any = False
        self._parser = _SSEParser()

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def connect(self) -> dict[str, Any]:
        """The keyword arguments of ``stream()`` for the next connection.

        Raises :class:`WaitTimeout` when the timeout has already passed."""
        read = _IDLE_TIMEOUT_S
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout("the timeout passed before the task ended")
            read = min(read, remaining)
        self._got_any, self._parser = False, _SSEParser()
        headers = {"Last-Event-ID": self.after} if self.after else {}
        options = {
            "params": self._params,
            "headers": headers,
            "timeout": httpx.Timeout(self._core.timeout, read=read),
        }
        return self._core._args(Request("GET", f"/v1/tasks/{self.task_id}/events", options))

    def feed(self, line: str) -> TaskEvent | None:
        """The event that ``line`` (of the connection's body) completes, if any."""
        event = self._parser.feed(line)
        if event is not None:
            self._got_any, self._failures, self.after = True, 0, event.id
        return event

    def over(self, event: TaskEvent) -> bool:
        """After ``event`` was handed on: whether the stream is over (it was the terminal
        event). Raises :class:`WaitTimeout` when the timeout has passed."""
        if event.is_final:
            return True
        if self._expired():
            raise WaitTimeout("the timeout passed before the task ended")
        return False

    @property
    def quiet(self) -> bool:
        """The connection ended without an event: if the task has ended, the caller has
        every event already (the client asks for the task before reconnecting)."""
        return not self._got_any

    def ended_early(self) -> APIConnectionError:
        """The error of a connection the server ended before the terminal event (a
        restart, a store hiccup): it is reconnected."""
        return APIConnectionError("the event stream ended early")

    def reconnect_delay_s(self, error: Exception) -> float:
        """After a connection failed with ``error`` (a transport error, an API error, or
        :meth:`ended_early`): the seconds to wait before the next. Raises instead when it
        is not to be retried: :class:`WaitTimeout` after the timeout, an API error that
        is not retried, :class:`APIConnectionError` after too many failures in a row."""
        if isinstance(error, httpx.TransportError):
            if self._expired():
                raise WaitTimeout("the timeout passed before the task ended") from error
        elif isinstance(error, APIError) and error.code not in RETRY_CODES:
            raise error
        self._failures += 1
        if self._failures > _MAX_RECONNECTS:
            raise APIConnectionError(f"the event stream of {self.task_id} keeps failing") from error
        return self._core._reconnect_delay_s(self._failures, error)
