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
import time
from collections.abc import AsyncGenerator, Iterator

import httpx

from ponder.client_core import _ERRORS as _ERRORS
from ponder.client_core import DEFAULT_URL as DEFAULT_URL
from ponder.client_core import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    ClientCore,
    ConflictError,
    EventStream,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    QueueFullError,
    RateLimitError,
    Request,
    TaskEvent,
    TaskPage,
    TextDelta,
    TooLargeError,
    UnavailableError,
    WaitTimeout,
    cancel_request,
    error_from_response,
    get_request,
    list_request,
    page_of,
    submit_request,
    takes_request_of,
    task_of,
)
from ponder.states import is_terminal
from ponder.types import Task, TaskStatus

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

# Defined in the core, these are the SDK's: tracebacks, reprs and help() name them
# ponder.client.*, where they are imported from (as trio and numpy do for theirs).
for _name in __all__:
    if (_public := globals().get(_name)) is not None:
        _public.__module__ = __name__


# --- blocking -------------------------------------------------------------------------
class Client(ClientCore[httpx.Client]):
    """The blocking client (see the module docstring). Close it, or use ``with``.

    ``base_url`` defaults to ``PONDER_URL`` (else http://127.0.0.1:8000), ``api_key``
    to ``PONDER_API_KEY``; ``timeout`` bounds each request (s); ``max_retries`` and
    ``max_retry_wait_s`` govern retries of ``queue_full``, ``rate_limited``,
    ``unavailable`` and connection failures (``max_retries=0``: none).
    """

    _http_class = httpx.Client

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, request: Request) -> httpx.Response:
        """``request``'s 2xx answer, retried as the core says."""
        args, attempt = self._args(request), 0
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = self._http.request(**args)
            except httpx.TransportError as e:
                outcome = e
            settled = self._settle(attempt, outcome)
            if isinstance(settled, httpx.Response):
                return settled
            time.sleep(settled)
            attempt += 1

    @takes_request_of(submit_request)
    def submit(self, request: Request) -> Task:
        return task_of(self._send(request))

    def get(self, task_id: str) -> Task:
        """The task as it is now."""
        return task_of(self._send(get_request(task_id)))

    def cancel(self, task_id: str) -> Task:
        """Cancel a pending or running task (:class:`ConflictError` if it already ended)."""
        return task_of(self._send(cancel_request(task_id)))

    def list(
        self, *, status: TaskStatus | str | None = None, limit: int = 20, cursor: str | None = None
    ) -> TaskPage:
        """One page of the caller's tasks, newest first (also :meth:`tasks`, the CLI's
        name: ``ponder tasks``)."""
        return page_of(self._send(list_request(status, limit, cursor)))

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
        stream = EventStream(
            self, task_id, last_event_id=last_event_id, timeout=timeout, deltas=deltas
        )
        while True:
            try:
                with self._http.stream(**stream.connect()) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_from_response(response)
                    for line in response.iter_lines():
                        if (event := stream.feed(line)) is not None:
                            yield event
                            if stream.over(event):
                                return
            except (httpx.TransportError, APIError) as e:
                error: Exception = e
            else:
                if stream.quiet and is_terminal(self.get(task_id).status):
                    return  # nothing after the last event: the caller has everything
                error = stream.ended_early()
            time.sleep(stream.reconnect_delay_s(error))

    def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Block until the task ends (following its events); return it.

        Raises :class:`WaitTimeout` after ``timeout`` seconds (the task goes on).
        """
        for _ in self.events(task_id, timeout=timeout, deltas=False):
            pass
        return self.get(task_id)


# --- async ----------------------------------------------------------------------------
class AsyncClient(ClientCore[httpx.AsyncClient]):
    """The asyncio client: the same methods as :class:`Client`, as coroutines."""

    _http_class = httpx.AsyncClient

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, request: Request) -> httpx.Response:
        """``request``'s 2xx answer, retried as the core says."""
        args, attempt = self._args(request), 0
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = await self._http.request(**args)
            except httpx.TransportError as e:
                outcome = e
            settled = self._settle(attempt, outcome)
            if isinstance(settled, httpx.Response):
                return settled
            await asyncio.sleep(settled)
            attempt += 1

    @takes_request_of(submit_request)
    async def submit(self, request: Request) -> Task:
        return task_of(await self._send(request))

    async def get(self, task_id: str) -> Task:
        """The task as it is now."""
        return task_of(await self._send(get_request(task_id)))

    async def cancel(self, task_id: str) -> Task:
        """Cancel a pending or running task (:class:`ConflictError` if it already ended)."""
        return task_of(await self._send(cancel_request(task_id)))

    async def list(
        self, *, status: TaskStatus | str | None = None, limit: int = 20, cursor: str | None = None
    ) -> TaskPage:
        """One page of the caller's tasks, newest first (also :meth:`tasks`, the CLI's
        name: ``ponder tasks``)."""
        return page_of(await self._send(list_request(status, limit, cursor)))

    tasks = list  # the CLI's verb (`ponder tasks`, `ponder list`)

    async def events(
        self,
        task_id: str,
        *,
        last_event_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the signature of Client.events
        deltas: bool = True,
    ) -> AsyncGenerator[TaskEvent, None]:
        """:meth:`Client.events`, as an async iterator."""
        stream = EventStream(
            self, task_id, last_event_id=last_event_id, timeout=timeout, deltas=deltas
        )
        while True:
            try:
                async with self._http.stream(**stream.connect()) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_from_response(response)
                    async for line in response.aiter_lines():
                        if (event := stream.feed(line)) is not None:
                            yield event
                            if stream.over(event):
                                return
            except (httpx.TransportError, APIError) as e:
                error: Exception = e
            else:
                if stream.quiet and is_terminal((await self.get(task_id)).status):
                    return  # nothing after the last event: the caller has everything
                error = stream.ended_early()
            await asyncio.sleep(stream.reconnect_delay_s(error))

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
