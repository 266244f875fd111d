"""The Python SDK: :class:`Client` (blocking) and :class:`AsyncClient`, over httpx.

::

    from ponder import Client

    with Client("http://127.0.0.1:8000") as client:      # PONDER_API_KEY is read if set
        task = client.submit("What is 17 * 24?", mode="deep")
        for event in client.events(task.id):              # SSE, resumed after a drop
            print(event.event, event.data)                # `delta`: text as it is written
        done = client.wait(task.id, timeout=60)           # event-driven, no polling
        print(done.result.answer if done.result else done.error)

Every method returns typed models (:class:`~ponder.types.Task`, :class:`TaskPage`,
:class:`TaskEvent`). A non-2xx answer raises the :class:`APIError` subclass of its
API error code (``e.code``: ``not_found``, ``queue_full``, …). ``submit`` checks its
request as the API does (the same model: no coercion, no NaN, no blank prompt) and
raises :class:`InvalidRequestError` before sending anything. A base URL that is not
http(s) or an API key that cannot be sent in a header is a
:class:`~ponder.errors.ConfigError` when the client is made. ``queue_full``,
``rate_limited`` and ``unavailable`` answers and connection failures are retried up to
``max_retries`` times, waiting what ``Retry-After`` says (at most ``max_retry_wait_s``)
or an exponential backoff with jitter; submits carry an ``Idempotency-Key`` so a retry
never creates a second task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from ponder import __version__
from ponder.api.schemas import TaskCreate, describe_errors
from ponder.errors import ConfigError, PonderError
from ponder.types import Result, Sample, Task, TaskStatus

__all__ = [
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "InternalServerError",
    "InvalidRequestError",
    "NotFoundError",
    "QueueFullError",
    "RateLimitError",
    "TaskEvent",
    "TaskPage",
    "TextDelta",
    "TooLargeError",
    "UnavailableError",
    "WaitTimeout",
]

DEFAULT_URL = "http://127.0.0.1:8000"
_TERMINAL = frozenset({"done", "partial_done", "failed", "cancelled"})
_RETRY_CODES = frozenset({"queue_full", "rate_limited", "unavailable"})
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
        return self.event in ("status", "result") and self.data.get("status") in _TERMINAL

    @property
    def status(self) -> TaskStatus | None:
        """The task status a ``status`` or ``result`` event carries."""
        if self.event in ("status", "result") and "status" in self.data:
            return TaskStatus(self.data["status"])
        return None

    @property
    def task(self) -> Task | None:
        """The whole task, carried by the ``result`` event."""
        return Task.model_validate(self.data) if self.event == "result" else None

    @property
    def sample(self) -> Sample | None:
        """The finished sample of a ``sample`` event."""
        return Sample.model_validate(self.data) if self.event == "sample" else None

    @property
    def result(self) -> Result | None:
        """The early answer of a ``preliminary`` event."""
        return Result.model_validate(self.data) if self.event == "preliminary" else None

    @property
    def delta(self) -> TextDelta | None:
        """The new text of a running sample, carried by a ``delta`` event."""
        if self.event != "delta":
            return None
        return TextDelta(int(self.data["index"]), int(self.data["offset"]), str(self.data["text"]))


@dataclass
class TaskPage:
    """One page of ``list``: newest first; pass ``next_cursor`` back for the next."""

    data: list[Task] = field(default_factory=list)
    next_cursor: str | None = None


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


def _parse(lines: Iterable[str]) -> Iterator[TaskEvent]:
    parser = _SSEParser()
    for line in lines:
        if (event := parser.feed(line)) is not None:
            yield event


# --- shared -------------------------------------------------------------------------
class _Base:
    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        max_retry_wait_s: float,
    ) -> None:
        self.base_url = _checked_url(base_url)
        key = api_key if api_key is not None else os.environ.get("PONDER_API_KEY")
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

    def _delay_s(self, attempt: int, error: Exception) -> float | None:
        """How long to wait before retry ``attempt`` (0-based), or None: do not retry."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, APIError):
            if error.code not in _RETRY_CODES:
                return None
            if error.retry_after_s is not None:
                return min(error.retry_after_s, self.max_retry_wait_s)
        backoff = min(_BACKOFF_BASE_S * 2.0**attempt, _BACKOFF_MAX_S)
        return min(backoff * self._rng.uniform(0.5, 1.0), self.max_retry_wait_s)

    @staticmethod
    def _submit_body(prompt: str | None, **fields: Any) -> dict[str, Any]:
        """The body of a submit, checked as the API checks it (422 InvalidRequestError)."""
        body = {k: v for k, v in {"prompt": prompt, **fields}.items() if v is not None}
        try:
            TaskCreate.model_validate(body)
        except ValidationError as e:
            raise InvalidRequestError(422, "invalid", describe_errors(e.errors())) from e
        return body

    @staticmethod
    def _page(response: httpx.Response) -> TaskPage:
        body = response.json()
        return TaskPage(
            data=[Task.model_validate(t) for t in body["data"]], next_cursor=body["next_cursor"]
        )

    @staticmethod
    def _list_params(
        status: TaskStatus | str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = TaskStatus(status).value
        if cursor is not None:
            params["cursor"] = cursor
        return params

    def _reconnect_delay_s(self, failures: int, error: Exception) -> float:
        """The wait before reconnecting an event stream: Retry-After, else a backoff."""
        if isinstance(error, APIError) and error.retry_after_s is not None:
            return min(error.retry_after_s, self.max_retry_wait_s)
        backoff = min(_BACKOFF_BASE_S * 2.0 ** (failures - 1), _BACKOFF_MAX_S)
        return backoff * self._rng.uniform(0.5, 1.0)

    def _stream_timeout(self, deadline: float | None) -> httpx.Timeout:
        read = _IDLE_TIMEOUT_S
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout("the timeout passed before the task ended")
            read = min(read, remaining)
        return httpx.Timeout(self.timeout, read=read)


def _checked_url(base_url: str | None) -> str:
    url = (base_url or os.environ.get("PONDER_URL") or DEFAULT_URL).rstrip("/")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"the service URL {url!r} (PONDER_URL) is not an http(s) URL; give e.g. {DEFAULT_URL}"
        )
    return url


def _events_params(deltas: bool) -> dict[str, str]:
    return {} if deltas else {"deltas": "false"}


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


# --- blocking -------------------------------------------------------------------------
class Client(_Base):
    """The blocking client (see the module docstring). Close it, or use ``with``.

    ``base_url`` defaults to ``PONDER_URL`` (else http://127.0.0.1:8000), ``api_key``
    to ``PONDER_API_KEY``; ``timeout`` bounds each request (s); ``max_retries`` and
    ``max_retry_wait_s`` govern retries of ``queue_full``, ``rate_limited``,
    ``unavailable`` and connection failures (``max_retries=0``: none).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_retry_wait_s: float = 60.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, max_retry_wait_s)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, self.base_url + path, headers=headers, **kwargs
                )
                if response.status_code < 400:
                    return response
                error: Exception = error_from_response(response)
            except httpx.TransportError as e:
                error = APIConnectionError(f"cannot reach {self.base_url}: {e!r}")
                error.__cause__ = e
            delay = self._delay_s(attempt, error)
            if delay is None:
                raise error
            time.sleep(delay)
            attempt += 1

    def submit(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        mode: str = "standard",
        task_type: str = "auto",
        priority: int = 3,
        callback_url: str | None = None,
        samples: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        timeout_s: float | None = None,
        tests: str | None = None,
        stop: list[str] | None = None,
        early_stop: bool | None = None,
        target_confidence: float | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        """Submit a task (``POST /v1/tasks``); returns it, ``pending``.

        Raises :class:`InvalidRequestError` without sending when the request is invalid.
        """
        body = self._submit_body(
            prompt, messages=messages, mode=mode, task_type=task_type, priority=priority,
            callback_url=callback_url, samples=samples, max_new_tokens=max_new_tokens,
            temperature=temperature, timeout_s=timeout_s, tests=tests, stop=stop,
            early_stop=early_stop, target_confidence=target_confidence, metadata=metadata,
        )  # fmt: skip
        key = idempotency_key or f"ponder-sdk-{uuid.uuid4().hex}"
        response = self._request("POST", "/v1/tasks", json=body, headers={"Idempotency-Key": key})
        return Task.model_validate(response.json())

    def get(self, task_id: str) -> Task:
        """The task as it is now."""
        return Task.model_validate(self._request("GET", f"/v1/tasks/{task_id}").json())

    def cancel(self, task_id: str) -> Task:
        """Cancel a pending or running task (:class:`ConflictError` if it already ended)."""
        return Task.model_validate(self._request("DELETE", f"/v1/tasks/{task_id}").json())

    def list(
        self, *, status: TaskStatus | str | None = None, limit: int = 20, cursor: str | None = None
    ) -> TaskPage:
        """One page of the caller's tasks, newest first (also :meth:`tasks`, the CLI's
        name: ``ponder tasks``)."""
        params = self._list_params(status, limit, cursor)
        return self._page(self._request("GET", "/v1/tasks", params=params))

    tasks = list  # the CLI's verb (`ponder tasks`, `ponder list`)

    def events(
        self,
        task_id: str,
        *,
        last_event_id: str | None = None,
        timeout: float | None = None,
        deltas: bool = True,
    ) -> Iterator[TaskEvent]:
        """The task's events (after ``last_event_id``) until its terminal event.

        A dropped connection is resumed with ``Last-Event-ID``: no event is missed or
        repeated. Raises :class:`WaitTimeout` after ``timeout`` seconds. ``deltas=False``
        leaves out the ``delta`` events (the text of running samples).
        """
        deadline = _deadline(timeout)
        after = last_event_id
        failures = 0
        while True:
            got_any = False
            try:
                headers = {**self.headers, **({"Last-Event-ID": after} if after else {})}
                with self._http.stream(
                    "GET",
                    f"{self.base_url}/v1/tasks/{task_id}/events",
                    params=_events_params(deltas),
                    headers=headers,
                    timeout=self._stream_timeout(deadline),
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_from_response(response)
                    for event in _parse(response.iter_lines()):
                        got_any, failures, after = True, 0, event.id
                        yield event
                        if event.is_final:
                            return
                        if _expired(deadline):
                            raise WaitTimeout("the timeout passed before the task ended")
            except httpx.TransportError as e:
                if _expired(deadline):
                    raise WaitTimeout("the timeout passed before the task ended") from e
                error: Exception = e
            except APIError as e:
                if e.code not in _RETRY_CODES:
                    raise
                error = e
            else:  # the server ended the stream early (a restart, a store hiccup)
                if not got_any and self.get(task_id).status.value in _TERMINAL:
                    return  # nothing after `after`: the caller has everything
                error = APIConnectionError("the event stream ended early")
            failures += 1
            if failures > _MAX_RECONNECTS:
                raise APIConnectionError(f"the event stream of {task_id} keeps failing") from error
            time.sleep(self._reconnect_delay_s(failures, error))

    def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Block until the task ends (following its events); return it.

        Raises :class:`WaitTimeout` after ``timeout`` seconds (the task goes on).
        """
        for _ in self.events(task_id, timeout=timeout, deltas=False):
            pass
        return self.get(task_id)


# --- async ----------------------------------------------------------------------------
class AsyncClient(_Base):
    """The asyncio client: the same methods as :class:`Client`, as coroutines."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_retry_wait_s: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, max_retry_wait_s)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, self.base_url + path, headers=headers, **kwargs
                )
                if response.status_code < 400:
                    return response
                error: Exception = error_from_response(response)
            except httpx.TransportError as e:
                error = APIConnectionError(f"cannot reach {self.base_url}: {e!r}")
                error.__cause__ = e
            delay = self._delay_s(attempt, error)
            if delay is None:
                raise error
            await asyncio.sleep(delay)
            attempt += 1

    async def submit(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        mode: str = "standard",
        task_type: str = "auto",
        priority: int = 3,
        callback_url: str | None = None,
        samples: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        timeout_s: float | None = None,
        tests: str | None = None,
        stop: list[str] | None = None,
        early_stop: bool | None = None,
        target_confidence: float | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        """Submit a task (``POST /v1/tasks``); returns it, ``pending``.

        Raises :class:`InvalidRequestError` without sending when the request is invalid.
        """
        body = self._submit_body(
            prompt, messages=messages, mode=mode, task_type=task_type, priority=priority,
            callback_url=callback_url, samples=samples, max_new_tokens=max_new_tokens,
            temperature=temperature, timeout_s=timeout_s, tests=tests, stop=stop,
            early_stop=early_stop, target_confidence=target_confidence, metadata=metadata,
        )  # fmt: skip
        key = idempotency_key or f"ponder-sdk-{uuid.uuid4().hex}"
        response = await self._request(
            "POST", "/v1/tasks", json=body, headers={"Idempotency-Key": key}
        )
        return Task.model_validate(response.json())

    async def get(self, task_id: str) -> Task:
        """The task as it is now."""
        return Task.model_validate((await self._request("GET", f"/v1/tasks/{task_id}")).json())

    async def cancel(self, task_id: str) -> Task:
        """Cancel a pending or running task (:class:`ConflictError` if it already ended)."""
        response = await self._request("DELETE", f"/v1/tasks/{task_id}")
        return Task.model_validate(response.json())

    async def list(
        self, *, status: TaskStatus | str | None = None, limit: int = 20, cursor: str | None = None
    ) -> TaskPage:
        """One page of the caller's tasks, newest first (also :meth:`tasks`, the CLI's
        name: ``ponder tasks``)."""
        params = self._list_params(status, limit, cursor)
        return self._page(await self._request("GET", "/v1/tasks", params=params))

    tasks = list  # the CLI's verb (`ponder tasks`, `ponder list`)

    async def events(
        self,
        task_id: str,
        *,
        last_event_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the signature of Client.events
        deltas: bool = True,
    ) -> AsyncGenerator[TaskEvent, None]:
        """The task's events (after ``last_event_id``) until its terminal event.

        A dropped connection is resumed with ``Last-Event-ID``: no event is missed or
        repeated. Raises :class:`WaitTimeout` after ``timeout`` seconds. ``deltas=False``
        leaves out the ``delta`` events (the text of running samples).
        """
        deadline = _deadline(timeout)
        after = last_event_id
        failures = 0
        while True:
            got_any = False
            try:
                headers = {**self.headers, **({"Last-Event-ID": after} if after else {})}
                async with self._http.stream(
                    "GET",
                    f"{self.base_url}/v1/tasks/{task_id}/events",
                    params=_events_params(deltas),
                    headers=headers,
                    timeout=self._stream_timeout(deadline),
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_from_response(response)
                    parser = _SSEParser()
                    async for line in response.aiter_lines():
                        if (event := parser.feed(line)) is None:
                            continue
                        got_any, failures, after = True, 0, event.id
                        yield event
                        if event.is_final:
                            return
                        if _expired(deadline):
                            raise WaitTimeout("the timeout passed before the task ended")
            except httpx.TransportError as e:
                if _expired(deadline):
                    raise WaitTimeout("the timeout passed before the task ended") from e
                error: Exception = e
            except APIError as e:
                if e.code not in _RETRY_CODES:
                    raise
                error = e
            else:
                if not got_any and (await self.get(task_id)).status.value in _TERMINAL:
                    return
                error = APIConnectionError("the event stream ended early")
            failures += 1
            if failures > _MAX_RECONNECTS:
                raise APIConnectionError(f"the event stream of {task_id} keeps failing") from error
            await asyncio.sleep(self._reconnect_delay_s(failures, error))

    async def wait(
        self,
        task_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the signature of Client.wait
    ) -> Task:
        """Wait until the task ends (following its events); return it.

        Raises :class:`WaitTimeout` after ``timeout`` seconds (the task goes on).
        """
        try:
            async with asyncio.timeout(timeout):
                async with contextlib.aclosing(self.events(task_id, deltas=False)) as events:
                    async for _ in events:
                        pass
        except TimeoutError as e:
            if isinstance(e, WaitTimeout):
                raise
            raise WaitTimeout(f"task {task_id} did not end within {timeout:g}s") from e
        return await self.get(task_id)
