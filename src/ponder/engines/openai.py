"""An engine that delegates generation to an OpenAI-compatible server over HTTP.

``POST {openai_base_url}/chat/completions`` with the bearer key ``openai_api_key`` and the
model ``openai_model``. Rows of one batch that share a prompt and sampling parameters (the
samples of one task) go as one request with ``n`` set, carrying the first row's seed (the
server draws the n samples from it); a server that ignores ``n`` (returns fewer choices)
is remembered, and its rows are sent one request each from then on, each with its seed.

Each request has a time limit (``openai_timeout_s``). Answers 429 and 5xx, and failures to
connect, are retried up to ``openai_max_retries`` times with exponential backoff and
jitter (at least the server's ``Retry-After``); any other failure is that row's EngineError.
Log-probabilities are requested, and their mean is reported when the server returns them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from statistics import fmean
from typing import Any, TypeVar

import httpx

from ponder.config import Settings
from ponder.engines.base import BaseEngine, BatchResult, FinishReason, SampleOutput, SampleRequest
from ponder.errors import ConfigError, EngineError

__all__ = ["OpenAIEngine"]

T = TypeVar("T")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


class _Rejected(EngineError):
    """The server refused the request itself (a 4xx other than 429): retrying cannot help."""


class OpenAIEngine(BaseEngine):
    """A remote OpenAI-compatible chat-completions server. See the module docstring.

    ``backoff_s`` is the first retry's delay, doubled each retry up to ``max_backoff_s``.
    """

    name = "openai"

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
        self._api_key = settings.openai_api_key
        self._timeout_s = settings.openai_timeout_s
        self._max_retries = settings.openai_max_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._client: httpx.AsyncClient | None = None
        #: whether the server honours ``n``; None until a request with n > 1 tells
        self.supports_n: bool | None = None

    async def start(self) -> None:
        """Open the connection pool. Idempotent."""
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self._base_url, headers=headers, timeout=self._timeout_s
            )

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        """See :meth:`BaseEngine.generate`: every failure is the EngineError of its rows."""
        await self.start()
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, request in enumerate(batch):
            key = (
                request.prompt_key(),
                request.temperature,
                request.top_p,
                request.max_new_tokens,
                tuple(request.stop),
            )
            groups.setdefault(key, []).append(index)
        results: list[SampleOutput | EngineError | None] = [None] * len(batch)

        async def run_group(indices: list[int]) -> None:
            outputs = await self._group([batch[i] for i in indices])
            for i, output in zip(indices, outputs, strict=True):
                results[i] = output

        await asyncio.gather(*(run_group(indices) for indices in groups.values()))
        out: BatchResult = []
        for result in results:
            assert result is not None  # every group fills all its rows
            out.append(result)
        return out

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
        data = await _unless_cancelled(rows, lambda: self._post(body))
        if data is None:
            return None
        try:
            return _outputs(data)
        except (KeyError, TypeError, ValueError) as e:
            raise EngineError(f"malformed answer from {self._base_url}: {e!r}") from e

    async def _post(self, body: dict[str, Any]) -> Any:
        """POST one chat completion, retrying 429, 5xx and connection failures."""
        assert self._client is not None
        attempt = 0
        while True:
            retry_after = 0.0
            try:
                response = await self._client.post("/chat/completions", json=body)
            except httpx.TimeoutException as e:
                if not isinstance(e, httpx.ConnectTimeout):
                    # the server took the request and did not finish in time: asking
                    # again would most likely take as long
                    raise EngineError(
                        f"no answer from {self._base_url} within {self._timeout_s} s"
                    ) from e
                error = EngineError(f"cannot connect to {self._base_url}: {e!r}")
            except httpx.TransportError as e:
                error = EngineError(f"cannot reach {self._base_url}: {e!r}")
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return response.json()
                    except ValueError as e:
                        raise EngineError(f"{self._base_url} answered non-JSON: {e}") from e
                message = f"{self._base_url} answered {status}: {_error_message(response)}"
                if status != 429 and status < 500:
                    raise _Rejected(message)
                error = EngineError(message)
                retry_after = _retry_after(response)
            if attempt >= self._max_retries:
                raise error
            ceiling = min(self._max_backoff_s, self._backoff_s * 2**attempt)
            # jitter spreads the retries of many clients that failed at the same moment
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            await asyncio.sleep(max(delay, min(retry_after, self._max_backoff_s)))
            attempt += 1


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
            )
        )
    return outputs


def _cancelled() -> SampleOutput:
    return SampleOutput(text="", finish_reason="cancelled")


def _error_message(response: httpx.Response) -> str:
    """The server's error message on one line (OpenAI's ``{"error": {"message": ...}}``)."""
    try:
        detail = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = response.text[:200]
    return " ".join(str(detail).split()) or response.reason_phrase


def _retry_after(response: httpx.Response) -> float:
    """The ``Retry-After`` delay in seconds (0 when absent or given as a date)."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0
