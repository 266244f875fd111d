"""An engine that delegates generation to an OpenAI-compatible server over HTTP.

``POST {openai_base_url}/chat/completions`` with the bearer key ``openai_api_key`` and the
model ``openai_model``. **Every row is its own request** — servers such as vLLM, SGLang
and llama.cpp's server batch continuously on their side — with one exception: rows of one
task submitted together with the same prompt and sampling parameters (a task's samples)
go as one request with ``n`` set, carrying the first row's seed (the server draws the n
samples from it); a server that ignores ``n`` (returns fewer choices) is remembered, and
its rows are sent one request each from then on, each with its seed.

At most ``PONDER_OPENAI_MAX_CONCURRENCY`` requests are in flight; the others wait in an
admission queue and start by weighted fair share across priorities as requests return.
Each result is delivered when its own request returns. A row's ``timeout_s`` counts from
its request's start; a cancelled row is answered at once (``finish_reason="cancelled"``),
and a request whose rows are all cancelled is abandoned, which closes its connection
(servers then stop generating).

Each request also has a time limit (``openai_timeout_s``: to connect, and between two
reads of the answer). Answers 429 and 5xx, and
failures to connect, are retried up to ``openai_max_retries`` times with exponential
backoff and jitter (at least the server's ``Retry-After``); 401 and 403 mean the server
refuses the credentials: the engine is dead (EngineDeadError) until restarted with others;
any other failure is that row's EngineError. Log-probabilities are requested, and their
mean is reported when the server returns them.

**Structured rows.** A row's ``json_schema`` goes as ``response_format`` (``json_schema``
with the row's ``strict``, or ``json_object`` for the bare object); the text that comes back
is the row's text as it is: the per-field vote validates it.

**Streaming.** When a row has ``on_text`` and ``stream`` (the worker's delta events, while a
client follows the task's text), its request asks for ``stream: true`` (with
``stream_options.include_usage``) and each chunk's text is handed to the ``on_text`` of
the row its choice index belongs to, as it arrives; the pieces are also assembled into the
same answer a plain request gets. Otherwise the answer comes plain: a streamed one costs
the worker a chunk to parse per token, for text nobody reads. A stream that breaks after its
200 answer is that request's EngineError (not retried: the text already delivered would
be delivered twice).

**Transport.** aiohttp's client (its HTTP parser is compiled): about 0.1 ms of CPU a
request on loopback where httpx's pool took 1.5 ms at 16 requests in flight, which made
the HTTP client the largest part of a worker's CPU per task in front of a fast server.
The environment's proxy and ``.netrc`` credentials are read once, when the engine is made
(:class:`_Route`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, TypeVar

import aiohttp
from aiohttp.helpers import basicauth_from_netrc, get_env_proxy_for_url, netrc_from_env
from yarl import URL

from ponder.config import Settings
from ponder.engines.base import BaseEngine, FinishReason, SampleOutput, SampleRequest
from ponder.errors import ConfigError, EngineBusy, EngineDeadError, EngineError
from ponder.scheduling import AdmissionQueue

__all__ = ["OpenAIEngine", "response_format"]

T = TypeVar("T")

log = logging.getLogger("ponder.engine")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


class _Rejected(EngineError):
    """The server refused the request itself (a 4xx other than 429): retrying cannot help."""


@dataclass(eq=False)
class _Request:
    """Rows sent as one request (one row, or a task's samples sharing prompt and params)."""

    priority: int
    arrival: float
    rows: list[tuple[SampleRequest, asyncio.Future[SampleOutput]]] = field(default_factory=list)

    def live(self) -> list[tuple[SampleRequest, asyncio.Future[SampleOutput]]]:
        return [(r, f) for r, f in self.rows if not f.done() and not r.is_cancelled]


class OpenAIEngine(BaseEngine):
    """A remote OpenAI-compatible chat-completions server. See the module docstring.

    ``backoff_s`` is the first retry's delay, doubled each retry up to ``max_backoff_s``.
    """

    name = "openai"
    #: the upstream constrains: a structured row's schema goes as ``response_format``
    constrains_json = True

    def __init__(
        self, settings: Settings, *, backoff_s: float = 0.5, max_backoff_s: float = 8.0
    ) -> None:
        if not settings.openai_model:
            raise ConfigError(
                "PONDER_OPENAI_MODEL is empty: name the model the server should run "
                "(GET /v1/models on the server lists them)"
            )
        self.model_name = settings.openai_model
        self._base_url = settings.openai_base_url.rstrip("/")
        self._url = f"{self._base_url}/chat/completions"
        self._api_key = settings.openai_api_key
        self._timeout_s = settings.openai_timeout_s
        self._max_retries = settings.openai_max_retries
        self._max_in_flight = settings.openai_max_concurrency
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._client: aiohttp.ClientSession | None = None
        # (a few environment variables and at most one small file, read before the engine
        # serves: aiohttp's trust_env would read them in a thread for every request)
        try:
            self._route = _route_from_env(self._url, netrc=not self._api_key)
        except ValueError as e:  # yarl's: a port out of range, a broken IPv6 address, …
            raise ConfigError(
                f"PONDER_OPENAI_BASE_URL={settings.openai_base_url!r} is not a valid URL: {e}"
            ) from e
        self._queue: AdmissionQueue[_Request] = AdmissionQueue(
            settings.priority_quotas, settings.engine_max_queue
        )
        #: requests being formed in this event-loop tick, by task + prompt + parameters
        self._forming: dict[tuple[Any, ...], _Request] = {}
        self._in_flight: set[asyncio.Task[None]] = set()
        self._dead: EngineDeadError | None = None
        #: whether the server honours ``n``; None until a request with n > 1 tells
        self.supports_n: bool | None = None
        #: HTTP requests sent (retries included) and the most in flight at once
        self.requests_sent = 0
        self.peak_in_flight = 0

    async def start(self) -> None:
        """Open the connection pool. Idempotent."""
        if self._client is None:
            self._dead = None
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            headers |= self._route.headers
            t = self._timeout_s
            self._client = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t),
                connector=aiohttp.TCPConnector(limit=self._max_in_flight),
            )

    async def close(self) -> None:
        """Fail queued rows, abandon the requests in flight, close the pool. Idempotent."""
        client, self._client = self._client, None
        if client is None:
            return
        self._dead = self._dead or EngineDeadError("the openai engine is closed")
        for request in self._queue.drain():
            _resolve(request.rows, self._dead)
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "requests_in_flight": len(self._in_flight),
            "requests_queued": len(self._queue),
            "queued_by_priority": self._queue.depths(),
            "max_concurrency": self._max_in_flight,
            "peak_in_flight": self.peak_in_flight,
            "requests_sent": self.requests_sent,
        }

    async def submit(self, request: SampleRequest) -> SampleOutput:
        """Queue one row (joining its task's same-prompt rows of this tick) and await it."""
        if self._dead is not None:
            raise self._dead
        await self.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SampleOutput] = loop.create_future()
        key = (
            request.task_id,
            request.prompt_key(),
            request.temperature,
            request.top_p,
            request.max_new_tokens,
            tuple(request.stop),
            request.timeout_s,
            None if request.json_schema is None else json.dumps(request.json_schema),
            request.strict,
        )
        groups = request.task_id and self.supports_n is not False
        group = self._forming.get(key) if groups else None
        if group is None:
            group = _Request(priority=request.priority, arrival=time.monotonic())
            if groups:
                self._forming[key] = group
            loop.call_soon(self._enqueue, key, group)
        group.priority = min(group.priority, request.priority)
        group.rows.append((request, future))
        request.on_cancel(lambda: loop.call_soon_threadsafe(_settle_cancelled, future))
        try:
            return await future
        except asyncio.CancelledError:
            request.cancel()
            raise

    def _enqueue(self, key: tuple[Any, ...], group: _Request) -> None:
        if self._forming.get(key) is group:
            del self._forming[key]
        try:
            self._queue.put(group)
        except EngineBusy as e:
            _resolve(group.rows, e)
            return
        self._dispatch()

    def _dispatch(self) -> None:
        """Start queued requests while fewer than the limit are in flight."""
        while self._client is not None and len(self._in_flight) < self._max_in_flight:
            taken = self._queue.take(self._max_in_flight - len(self._in_flight))
            if not taken:
                return
            for group in taken:
                if not group.live():
                    continue  # every row was cancelled meanwhile: each is answered already
                task = asyncio.create_task(self._run(group), name="ponder-openai-request")
                self._in_flight.add(task)
                task.add_done_callback(self._request_done)
            self.peak_in_flight = max(self.peak_in_flight, len(self._in_flight))

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._dispatch()

    async def _run(self, group: _Request) -> None:
        """One request for the group's live rows; each row's output or error to its future."""
        rows = group.live()
        limits = [r.timeout_s for r, _ in rows if r.timeout_s is not None]
        try:
            async with asyncio.timeout(min(limits) if limits else None):
                outputs = await self._group([r for r, _ in rows])
        except TimeoutError:
            outputs = [SampleOutput(text="", finish_reason="timeout") for _ in rows]
        except EngineDeadError as e:
            self._dead = e
            _resolve(rows, e)
            return
        except asyncio.CancelledError:
            _resolve(rows, self._dead or EngineDeadError("the openai engine is closed"))
            raise
        for (_, future), output in zip(rows, outputs, strict=True):
            if not future.done():
                if isinstance(output, SampleOutput):
                    future.set_result(output)
                else:
                    future.set_exception(output)

    async def _group(self, rows: list[SampleRequest]) -> list[SampleOutput | EngineError]:
        """Rows sharing a prompt and parameters: one request with ``n``, or one each."""
        if len(rows) == 1 or self.supports_n is False:
            return list(await asyncio.gather(*(self._single(row) for row in rows)))
        try:
            outputs = await self._call(rows, n=len(rows))
        except _Rejected as e:
            if self.supports_n is not None:
                return [e] * len(rows)
            # the server may refuse ``n`` itself: try the rows one by one, and stop
            # sending ``n`` if that works
            single = list(await asyncio.gather(*(self._single(row) for row in rows)))
            if any(isinstance(output, SampleOutput) for output in single):
                self.supports_n = False
            return single
        except EngineError as e:
            return [e] * len(rows)
        if outputs is None:
            return [_cancelled() for _ in rows]
        if len(outputs) >= len(rows):
            self.supports_n = True
            return list(outputs[: len(rows)])
        # the server ignored ``n``: keep what it returned and ask for the rest one by one
        self.supports_n = False
        rest = await asyncio.gather(*(self._single(row) for row in rows[len(outputs) :]))
        return [*outputs, *rest]

    async def _single(self, row: SampleRequest) -> SampleOutput | EngineError:
        try:
            outputs = await self._call([row], n=1)
        except EngineError as e:
            return e
        if not outputs:
            return _cancelled() if outputs is None else EngineError("the server sent no choice")
        return outputs[0]

    async def _call(self, rows: list[SampleRequest], n: int) -> list[SampleOutput] | None:
        """One chat completion for ``rows`` (same prompt and parameters), with retries.

        None when every row was cancelled first: the request in flight is abandoned, which
        closes its connection (servers such as vLLM then stop generating).
        """
        first = rows[0]
        messages = first.messages
        if messages is None:
            messages = [{"role": "user", "content": first.prompt or ""}]
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": messages,
            "temperature": first.temperature,
            "top_p": first.top_p,
            "max_tokens": first.max_new_tokens,
            "logprobs": True,
        }
        if n > 1:
            body["n"] = n
        if first.stop:
            body["stop"] = first.stop
        if first.seed is not None:
            # one seed for the request: with n > 1 the server draws the n samples from it
            body["seed"] = first.seed
        if first.json_schema is not None:
            body["response_format"] = response_format(first.json_schema, strict=first.strict)
        listeners = [row.on_text if row.stream else None for row in rows]
        if any(listeners):
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        data = await _unless_cancelled(rows, lambda: self._post(body, listeners))
        if data is None:
            return None
        try:
            return _outputs(data)
        except (KeyError, TypeError, ValueError) as e:
            raise EngineError(f"malformed answer from {self._base_url}: {e!r}") from e

    async def _read_stream(
        self, response: aiohttp.ClientResponse, listeners: list[Callable[[str], object] | None]
    ) -> dict[str, Any]:
        """The chunks of a streamed answer, text handed on as it comes, then assembled."""
        choices: dict[int, _StreamedChoice] = {}
        usage: Any = None
        try:
            async for raw in response.content:
                line = raw.decode()
                payload = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if not payload:
                    continue  # blank lines, comments, event names
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    message = " ".join(str((chunk["error"] or {}).get("message", "")).split())
                    raise EngineError(f"{self._base_url} failed mid-stream: {message}")
                usage = chunk.get("usage") or usage
                for part in chunk.get("choices") or []:
                    index = int(part.get("index", 0))
                    choice = choices.setdefault(index, _StreamedChoice())
                    piece = choice.add(part)
                    listener = listeners[index] if index < len(listeners) else None
                    if piece and listener is not None:
                        _call_listener(listener, piece)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EngineError(f"the stream from {self._base_url} broke: {e!r}") from e
        except (ValueError, TypeError, AttributeError) as e:
            raise EngineError(f"malformed stream from {self._base_url}: {e!r}") from e
        return {
            "choices": [c.as_choice(i) for i, c in sorted(choices.items())],
            "usage": usage or {},
        }

    async def _post(
        self, body: dict[str, Any], listeners: list[Callable[[str], object] | None]
    ) -> Any:
        """POST one chat completion, retrying 429, 5xx and connection failures.

        A streamed answer (``body["stream"]``) feeds ``listeners[i]`` with the text of
        choice ``i`` as it arrives and is returned assembled, in a plain answer's shape.
        """
        attempt = 0
        while True:
            if self._client is None:
                raise EngineDeadError("the openai engine is closed")
            retry_after = 0.0
            self.requests_sent += 1
            try:
                async with self._client.post(
                    self._url,
                    json=body,
                    proxy=self._route.proxy,
                    proxy_headers=self._route.proxy_headers,
                ) as response:
                    if response.status == 200 and _is_event_stream(response):
                        # (a server that ignores ``stream`` answers plain JSON: read below)
                        return await self._read_stream(response, listeners)
                    content = await response.read()
            except aiohttp.ConnectionTimeoutError as e:
                error = EngineError(f"cannot connect to {self._base_url}: {e!r}")
            except TimeoutError as e:  # aiohttp's read timeouts are TimeoutErrors too
                # the server took the request and did not finish in time: asking again
                # would most likely take as long
                raise EngineError(
                    f"no answer from {self._base_url} within {self._timeout_s} s"
                ) from e
            except aiohttp.ClientError as e:
                error = EngineError(f"cannot reach {self._base_url}: {e!r}")
            else:
                status = response.status
                if status == 200:
                    try:
                        return json.loads(content)
                    except ValueError as e:
                        raise EngineError(f"{self._base_url} answered non-JSON: {e}") from e
                message = f"{self._base_url} answered {status}: {_error_message(response, content)}"
                if status in (401, 403):
                    raise EngineDeadError(
                        f"{message}; the server refuses the credentials: check "
                        "PONDER_OPENAI_API_KEY and restart the worker"
                    )
                if status != 429 and status < 500:
                    raise _Rejected(message)
                error = EngineError(message)
                retry_after = _retry_after(response.headers.get("Retry-After", "0"))
            if attempt >= self._max_retries:
                raise error
            ceiling = min(self._max_backoff_s, self._backoff_s * 2**attempt)
            # jitter spreads the retries of many clients that failed at the same moment
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            await asyncio.sleep(max(delay, min(retry_after, self._max_backoff_s)))
            attempt += 1


@dataclass(frozen=True)
class _Route:
    """How requests reach the server, from the environment: its proxy (``HTTP_PROXY``,
    ``HTTPS_PROXY``, ``NO_PROXY``, with the proxy's credentials) and, without an API key,
    ``~/.netrc``'s credentials for the host (``NETRC`` names another file): what
    aiohttp's ``trust_env`` and httpx read. Read once, when the engine is made: aiohttp's
    ``trust_env`` reads them in a thread for every request, which cost about a quarter of
    a worker's CPU per fast task in front of a fast server."""

    proxy: URL | None = None
    #: headers of the tunnel's CONNECT (an https server behind the proxy)
    proxy_headers: dict[str, str] | None = None
    #: headers of every request: ``Authorization`` from ``.netrc``, and the credentials of
    #: a plain-HTTP proxy, which reads them from the request it forwards
    headers: dict[str, str] = field(default_factory=dict)


def _route_from_env(url: str, *, netrc: bool) -> _Route:
    target = URL(url)
    proxy: URL | None = None
    proxy_headers, headers = None, {}
    with contextlib.suppress(LookupError):  # no proxy for this URL
        proxy, proxy_auth = get_env_proxy_for_url(target)
        if proxy_auth is not None:
            credentials = {"Proxy-Authorization": proxy_auth.encode()}
            if target.scheme == "https":
                proxy_headers = credentials
            else:
                headers = credentials
    if netrc and target.host is not None:
        with contextlib.suppress(LookupError):  # no .netrc, or no entry for the host
            auth = basicauth_from_netrc(netrc_from_env(), target.host)
            headers = {**headers, "Authorization": auth.encode()}
    return _Route(proxy, proxy_headers, headers)


def _is_event_stream(response: aiohttp.ClientResponse) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("text/event-stream")


@dataclass
class _StreamedChoice:
    """One choice of a streamed answer, as its chunks arrive."""

    pieces: list[str] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, part: dict[str, Any]) -> str:
        """Take one chunk's part of this choice; return its new text."""
        piece = str((part.get("delta") or {}).get("content") or "")
        if piece:
            self.pieces.append(piece)
        self.logprobs += (part.get("logprobs") or {}).get("content") or []
        self.finish_reason = part.get("finish_reason") or self.finish_reason
        return piece

    def as_choice(self, index: int) -> dict[str, Any]:
        """The choice in a plain (not streamed) answer's shape."""
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(self.pieces)},
            "finish_reason": self.finish_reason,
            "logprobs": {"content": self.logprobs} if self.logprobs else None,
        }


def response_format(schema: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a row's schema (``json_object``: the bare object)."""
    if schema == {"type": "object"}:
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": strict},
    }


def _call_listener(listener: Callable[[str], object], piece: str) -> None:
    try:
        listener(piece)
    except Exception:
        log.exception("an on_text callback failed")


async def _unless_cancelled(
    rows: list[SampleRequest], call: Callable[[], Awaitable[T]]
) -> T | None:
    """``await call()``, or None once every row is cancelled (before or during the call)."""
    if all(row.is_cancelled for row in rows):
        return None
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call())

    def on_cancel() -> None:
        # runs in whichever thread cancelled the row
        if all(row.is_cancelled for row in rows) and not task.done():
            loop.call_soon_threadsafe(task.cancel)

    for row in rows:
        row.on_cancel(on_cancel)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the caller itself was cancelled
        return None


def _outputs(data: Any) -> list[SampleOutput]:
    """The choices of a chat-completion answer, in index order."""
    choices = sorted(data["choices"], key=lambda c: int(c.get("index", 0)))
    usage = data.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens", 0))
    total_completion = int(usage.get("completion_tokens", 0))
    outputs = []
    for choice in choices:
        tokens = (choice.get("logprobs") or {}).get("content") or []
        outputs.append(
            SampleOutput(
                text=choice["message"].get("content") or "",
                prompt_tokens=prompt_tokens,
                # usage counts all choices together: without per-token data, share it out
                completion_tokens=len(tokens) or round(total_completion / len(choices)),
                finish_reason=_FINISH.get(choice.get("finish_reason"), "stop"),
                mean_logprob=fmean(float(t["logprob"]) for t in tokens) if tokens else None,
                token_logprobs=[float(t["logprob"]) for t in tokens] if tokens else None,
            )
        )
    return outputs


def _cancelled() -> SampleOutput:
    return SampleOutput(text="", finish_reason="cancelled")


def _settle_cancelled(future: asyncio.Future[SampleOutput]) -> None:
    if not future.done():
        future.set_result(_cancelled())


def _resolve(
    rows: list[tuple[SampleRequest, asyncio.Future[SampleOutput]]], error: BaseException
) -> None:
    for _, future in rows:
        if not future.done():
            future.set_exception(error)


def _error_message(response: aiohttp.ClientResponse, content: bytes) -> str:
    """The server's error message on one line (OpenAI's ``{"error": {"message": ...}}``)."""
    try:
        detail = json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = content[:200].decode(errors="replace")
    return " ".join(str(detail).split()) or response.reason or ""


def _retry_after(value: str) -> float:
    """A ``Retry-After`` delay in seconds (0 when given as a date)."""
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.0
