"""Webhooks: signatures, the SSRF guard, and delivery to a real receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import standardwebhooks
import uvicorn

from ponder import metrics
from ponder.config import Settings
from ponder.errors import StoreUnavailable
from ponder.ids import IdGenerator
from ponder.store import OutboxEntry, TaskStore, create_store
from ponder.store.base import Admission
from ponder.types import CallbackInfo, Delivery, Result, Task, TaskStatus, utcnow
from ponder.webhooks import (
    EVENTS,
    WebhookSender,
    WebhookVerificationError,
    check_callback_url,
    generate_secret,
    sign,
    signed_headers,
    terminal_event,
    verify,
    webhook_id,
)
from tests.conftest import LiveServer, open_store, start_uvicorn, until, wait_for_task

pytestmark = pytest.mark.timeout(60)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
_ids = IdGenerator("test1")


# --- signatures -----------------------------------------------------------------------
def test_sign_matches_the_standard_webhooks_test_vector() -> None:
    # the example of the Standard Webhooks reference libraries
    signature = sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_verify_round_trip_and_forgeries() -> None:
    body = json.dumps({"type": "task.completed", "data": {"id": "x"}}).encode()
    headers = signed_headers(SECRET, "msg_1", body)
    assert verify(headers, body, SECRET)["type"] == "task.completed"
    # the reference library accepts what we sign
    standardwebhooks.Webhook(SECRET).verify(body, headers)
    # any mapping of headers, in any case
    assert verify(httpx.Headers({k.upper(): v for k, v in headers.items()}), body, SECRET)
    with pytest.raises(WebhookVerificationError):
        verify(headers, body + b" ", SECRET)  # body changed
    with pytest.raises(WebhookVerificationError):
        verify(headers, body, generate_secret())  # another secret
    with pytest.raises(WebhookVerificationError):
        verify({**headers, "webhook-id": "msg_2"}, body, SECRET)  # id changed
    old = signed_headers(SECRET, "msg_1", body, timestamp=int(utcnow().timestamp()) - 600)
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(old, body, SECRET)
    for broken in ("garbage", "v1,!!!", ""):
        with pytest.raises(WebhookVerificationError):
            verify({**headers, "webhook-signature": broken}, body, SECRET)
    missing = {k: v for k, v in headers.items() if k != "webhook-timestamp"}
    with pytest.raises(WebhookVerificationError):
        verify(missing, body, SECRET)
    # several signatures (a secret being rotated): one match is enough
    rotated = {**headers, "webhook-signature": "v1,AAAA " + headers["webhook-signature"]}
    assert verify(rotated, body, SECRET)


def test_generated_secrets_are_valid_settings() -> None:
    from tests.conftest import make_settings

    secret = generate_secret()
    assert secret.startswith("whsec_")
    settings = make_settings(webhook_secret=secret)
    assert settings.webhook_secret is not None
    assert settings.webhook_secret.get_secret_value() == secret
    assert secret not in repr(settings)


def test_terminal_events() -> None:
    assert terminal_event(TaskStatus.done) == "task.completed"
    assert terminal_event("partial_done") == "task.partial"
    assert terminal_event("failed") == "task.failed"
    assert terminal_event("cancelled") == "task.cancelled"
    assert terminal_event(TaskStatus.expired) == "task.expired"
    events = {"task.preliminary", "task.completed", "task.partial", "task.failed",
              "task.cancelled", "task.expired"}  # fmt: skip
    assert events == EVENTS
    for status in ("pending", "running", "bogus"):
        with pytest.raises(ValueError, match="terminal"):
            terminal_event(status)


# --- the SSRF guard -------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://localhost:8080/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.1.1/hook",
        "http://169.254.10.10/hook",
        "http://0.0.0.0/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://[fe80::1]/hook",
        "http://100.64.0.1/hook",
        "http://224.0.0.1/hook",
        "http://2130706433/hook",  # 127.0.0.1 as one number
    ],
)
async def test_private_callback_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="callback_url"):
        await check_callback_url(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
    ],
)
async def test_metadata_addresses_are_refused_even_when_private_is_allowed(url: str) -> None:
    with pytest.raises(ValueError, match="metadata"):
        await check_callback_url(url, allow_private=True)


async def test_allowed_callback_urls() -> None:
    await check_callback_url("http://127.0.0.1:9/hook", allow_private=True)
    await check_callback_url("http://localhost/hook", allow_private=True)
    await check_callback_url("https://93.184.215.14/hook", allow_private=False)  # public literal
    with pytest.raises(ValueError, match="does not resolve"):
        await check_callback_url("http://no-such-host.invalid/hook", allow_private=True)
    with pytest.raises(ValueError, match="callback_url"):
        await check_callback_url("ftp://example.com/", allow_private=True)


async def test_submit_checks_callback_urls(settings: Settings) -> None:
    closed = settings.model_copy(update={"webhook_secret": None})
    async with LiveServer(closed, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        r = await c.post("/v1/tasks", json={"prompt": "x", "callback_url": "http://8.8.8.8/h"})
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "invalid"
        assert "PONDER_WEBHOOK_SECRET" in r.json()["error"]["message"]
    signed = settings.model_copy(update={"webhook_secret": _secret(SECRET)})
    async with LiveServer(signed, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        for url in ("http://127.0.0.1:9/h", "http://169.254.169.254/", "http://localhost/h"):
            r = await c.post("/v1/tasks", json={"prompt": "x", "callback_url": url})
            assert r.status_code == 422, r.text
            message = r.json()["error"]["message"]
            assert message.startswith("callback_url:") and "Traceback" not in r.text
        assert (await c.get("/v1/tasks")).json()["data"] == []
        r = await c.post("/v1/tasks", json={"prompt": "x", "callback_url": "http://8.8.8.8/h"})
        assert r.status_code == 202
        assert r.json()["callback"] == {"url": "http://8.8.8.8/h", "deliveries": []}
    loose = signed.model_copy(update={"callback_allow_private": True})
    async with LiveServer(loose, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        r = await c.post("/v1/tasks", json={"prompt": "x", "callback_url": "http://127.0.0.1:9/"})
        assert r.status_code == 202
        r = await c.post(
            "/v1/tasks", json={"prompt": "x", "callback_url": "http://169.254.169.254/"}
        )
        assert r.status_code == 422


# --- a receiver on loopback -----------------------------------------------------------
class Receiver:
    """An HTTP server on 127.0.0.1 that answers each webhook as scripted.

    ``script`` gives one action per request (the last repeats): a status code,
    ``"hang"`` (answer only when the receiver stops), ``"slow"`` (200 after 0.2 s) or
    ``"endless"`` (200 with a body far over any read cap). ``port`` 0 picks a free one.
    """

    def __init__(self, script: list[int | str], port: int = 0) -> None:
        self.script = script
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.arrived = asyncio.Queue[int]()
        self.arrival_times: list[float] = []
        #: when each answer had been sent, in the order of the requests
        self.answered_times: dict[int, float] = {}
        self.concurrent = self.most_concurrent = 0
        self._release = asyncio.Event()
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
        )
        self.server = uvicorn.Server(config)
        self.url = ""
        self._task: asyncio.Task[None] | None = None

    async def app(
        self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        assert scope["type"] == "http"
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            await self._answer(scope, receive, send)
        finally:
            self.concurrent -= 1

    async def _answer(
        self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((headers, body))
        self.arrival_times.append(time.monotonic())
        number = len(self.requests) - 1
        action = self.script[min(len(self.requests), len(self.script)) - 1]
        self.arrived.put_nowait(len(self.requests))
        if action == "hang":
            await self._release.wait()
            action = 200
        if action == "slow":
            await asyncio.sleep(0.2)
            action = 200
        if action == "endless":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            chunk = b"x" * 65536
            for _ in range(200):  # 13 MB: far over the sender's cap
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        status = int(action)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"nope" if status >= 300 else b"ok"})
        self.answered_times[number] = time.monotonic()

    async def __aenter__(self) -> Receiver:
        self._task, port = await start_uvicorn(self.server)
        self.url = f"http://127.0.0.1:{port}/hooks/ponder"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)

    def ids(self) -> set[str]:
        return {headers["webhook-id"] for headers, _ in self.requests}


def _secret(value: str) -> Any:
    from pydantic import SecretStr

    return SecretStr(value)


def sender_settings(settings: Settings, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "webhook_secret": _secret(SECRET),
        "webhook_retry_s": [0.01, 0.01, 0.01],
        "webhook_timeout_s": 5.0,
        "callback_allow_private": True,
    }
    return settings.model_copy(update={**base, **overrides})


@pytest.fixture
async def store_for(settings: Settings) -> AsyncIterator[TaskStore]:
    async with open_store(settings) as store:
        yield store


async def finished_task(
    store: TaskStore, url: str, status: TaskStatus = TaskStatus.done, *, preliminary: bool = False
) -> Task:
    """A task with a callback that has reached ``status`` (through running): its writes
    put its webhooks in the outbox, as a worker's would."""
    task = Task(id=_ids.new_id(), prompt="x", samples_planned=1, callback=CallbackInfo(url=url))
    task, _ = await store.create_task(task, Admission(max_pending=100))
    task.status = TaskStatus.running
    events: list[tuple[str, dict[str, Any]]] = [("status", {"status": "running"})]
    if preliminary:
        events.append(("preliminary", {"answer": "41"}))
    assert await store.update_task(task, events)
    task.status = status
    task.finished_at = utcnow()
    if status == TaskStatus.done:
        task.result = Result(answer="42", text="The answer is 42.", confidence=0.9, agreement=1.0,
                             votes={"42": 1}, chosen_sample=0)  # fmt: skip
    assert await store.update_task(task, [("result", task.to_public())])
    return task


@asynccontextmanager
async def sending(store: TaskStore, settings: Settings) -> AsyncIterator[WebhookSender]:
    """A delivery loop over ``store``, closed at the end."""
    sender = WebhookSender(store, settings)
    await sender.start()
    try:
        yield sender
    finally:
        await sender.close()


async def outbox_drained(store: TaskStore, timeout_s: float = 10) -> None:
    """Until the outbox is empty: every delivery ended."""

    async def empty() -> bool:
        return await store.outbox_depth() == 0

    await until(empty, timeout_s, "the outbox to drain", interval_s=0.02)


async def delivery(store: TaskStore, task_id: str, event: str) -> Delivery:
    task = await store.get_task(task_id)
    assert task is not None and task.callback is not None
    (found,) = [d for d in task.callback.deliveries if d.event == event]
    return found


def outcomes() -> dict[str, float]:
    names = ("delivered", "failed", "gone", "exhausted", "refused", "unconfigured", "superseded")
    return {
        n: metrics.REGISTRY.get_sample_value("ponder_webhook_deliveries_total", {"outcome": n}) or 0
        for n in names
    }


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in outcomes().items() if v != before[k]}


# --- delivery -------------------------------------------------------------------------
async def test_fails_twice_then_succeeds(settings: Settings, store_for: TaskStore) -> None:
    before = outcomes()
    async with Receiver([500, 503, 200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        async with sending(store_for, sender_settings(settings)):
            await outbox_drained(store_for)
    assert len(receiver.requests) == 3
    assert receiver.ids() == {webhook_id(task.id, "task.completed")}
    for headers, body in receiver.requests:
        payload = verify(headers, body, SECRET)
        assert payload["type"] == "task.completed"
        assert payload["data"]["id"] == task.id
        assert payload["data"]["result"]["answer"] == "42"
        assert payload["timestamp"].endswith("Z")
        assert headers["content-type"] == "application/json"
    stored = await store_for.get_task(task.id)
    assert stored is not None and stored.status == TaskStatus.done
    record = await delivery(store_for, task.id, "task.completed")
    assert (record.attempts, record.status_code, record.delivered, record.error) == (
        3,
        200,
        True,
        None,
    )
    assert record.webhook_id == webhook_id(task.id, "task.completed")
    assert delta(before) == {"failed": 2, "delivered": 1}
    assert await store_for.outbox_depth() == 0  # recording the attempts queued nothing more


async def test_410_stops_retrying(settings: Settings, store_for: TaskStore) -> None:
    before = outcomes()
    async with Receiver([410, 200]) as receiver:
        task = await finished_task(store_for, receiver.url, TaskStatus.failed)
        async with sending(store_for, sender_settings(settings)):
            await outbox_drained(store_for)
    assert len(receiver.requests) == 1
    record = await delivery(store_for, task.id, "task.failed")
    assert (record.attempts, record.status_code, record.delivered) == (1, 410, False)
    assert delta(before) == {"gone": 1}


async def test_exhausted_schedule_and_timeouts(settings: Settings, store_for: TaskStore) -> None:
    before = outcomes()
    async with Receiver(["hang", 500]) as receiver:
        task = await finished_task(store_for, receiver.url, TaskStatus.cancelled)
        config = sender_settings(settings, webhook_retry_s=[0.01, 0.02], webhook_timeout_s=0.3)
        async with sending(store_for, config):
            await outbox_drained(store_for)
    assert len(receiver.requests) == 3  # 1 + 2 retries, the first one timed out
    record = await delivery(store_for, task.id, "task.cancelled")
    assert (record.attempts, record.status_code, record.delivered) == (3, 500, False)
    assert record.error is not None and record.error.startswith("HTTP 500")
    assert delta(before) == {"failed": 2, "exhausted": 1}


async def test_no_retries_when_the_schedule_is_empty(
    settings: Settings, store_for: TaskStore
) -> None:
    async with Receiver([500]) as receiver:
        await finished_task(store_for, receiver.url)
        async with sending(store_for, sender_settings(settings, webhook_retry_s=[])):
            await outbox_drained(store_for)
    assert len(receiver.requests) == 1


async def test_reads_back_no_more_than_the_cap(settings: Settings, store_for: TaskStore) -> None:
    async with Receiver(["endless"]) as receiver:
        task = await finished_task(store_for, receiver.url)
        config = sender_settings(settings, webhook_max_response_bytes=1024)
        async with sending(store_for, config):
            await outbox_drained(store_for)
    assert (await delivery(store_for, task.id, "task.completed")).delivered


async def test_the_schedule_is_kept_across_a_restart(
    settings: Settings, store_for: TaskStore
) -> None:
    """The next attempt's time is stored: a new delivery loop waits for it."""
    async with Receiver([500, 200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        config = sender_settings(settings, webhook_retry_s=[1.0])
        async with sending(store_for, config):
            await asyncio.wait_for(receiver.arrived.get(), 10)

            async def recorded() -> bool:
                stored = await store_for.get_task(task.id)
                return (
                    stored is not None
                    and stored.callback is not None
                    and any(d.attempts for d in stored.callback.deliveries)
                )

            await until(recorded, 10, "the failed attempt's record")
        async with sending(store_for, config):  # another process, or this one restarted
            await outbox_drained(store_for)
    assert receiver.ids() == {webhook_id(task.id, "task.completed")}
    first, second = receiver.arrival_times
    assert second - first >= 0.8 * 1.0 - 0.05  # the retry kept its delay (±20% jitter)
    record = await delivery(store_for, task.id, "task.completed")
    assert (record.attempts, record.delivered) == (2, True)


async def test_a_loop_that_dies_mid_attempt_is_taken_over(settings: Settings) -> None:
    """Its lease lapses, another loop sends the entry again with the same webhook-id."""
    config = sender_settings(settings, webhook_timeout_s=0.5, store_timeout_s=0.2)
    stores = [create_store(config), create_store(config)]
    for store in stores:
        await store.start()
    doomed = WebhookSender(stores[0], config.model_copy(update={"shutdown_grace_s": 0}))
    try:
        async with Receiver(["hang", 200]) as receiver:
            task = await finished_task(stores[1], receiver.url)
            await doomed.start()
            await asyncio.wait_for(receiver.arrived.get(), 10)

            async def dead(*_: object) -> bool:
                raise StoreUnavailable("the process is gone")

            stores[0].retry_delivery = dead  # type: ignore[method-assign]
            await doomed.close()  # it cannot hand the entry back: a crash
            async with sending(stores[1], config) as survivor:
                started = time.monotonic()
                await outbox_drained(stores[1])
        assert time.monotonic() - started >= survivor.lease_s - 1.0  # waited out the lease
        assert len(receiver.requests) == 2
        assert receiver.ids() == {webhook_id(task.id, "task.completed")}
        record = await delivery(stores[1], task.id, "task.completed")
        assert (record.attempts, record.delivered) == (1, True)  # the hung one never ended
    finally:
        for store in stores:
            await store.close()


async def test_refused_and_unconfigured_deliveries_send_nothing(
    settings: Settings, store_for: TaskStore
) -> None:
    before = outcomes()
    async with Receiver([200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        async with sending(store_for, sender_settings(settings, callback_allow_private=False)):
            await outbox_drained(store_for)
        other = await finished_task(store_for, receiver.url)
        async with sending(store_for, sender_settings(settings, webhook_secret=None)):
            await outbox_drained(store_for)
    assert receiver.requests == []
    record = await delivery(store_for, task.id, "task.completed")
    assert record.attempts == 0 and not record.delivered
    assert record.error is not None and "loopback" in record.error
    assert "secret" in ((await delivery(store_for, other.id, "task.completed")).error or "")
    assert delta(before) == {"refused": 1, "unconfigured": 1}


async def test_a_preliminary_of_a_task_that_ended_is_never_sent(
    settings: Settings, store_for: TaskStore
) -> None:
    """A task that ended before its preliminary webhook went out (a quick task): only the
    terminal webhook is sent, and both records are kept."""
    before = outcomes()
    async with Receiver([200]) as receiver:
        task = await finished_task(store_for, receiver.url, preliminary=True)
        async with sending(store_for, sender_settings(settings)):
            await outbox_drained(store_for)
    payloads = [verify(h, b, SECRET) for h, b in receiver.requests]
    assert [(p["type"], p["data"]["status"]) for p in payloads] == [("task.completed", "done")]
    preliminary = await delivery(store_for, task.id, "task.preliminary")
    assert not preliminary.delivered and preliminary.attempts == 0
    assert preliminary.error == "gave up: the task ended before it was sent"
    assert (await delivery(store_for, task.id, "task.completed")).delivered
    assert delta(before) == {"delivered": 1, "superseded": 1}


async def test_a_terminal_webhook_waits_for_the_preliminary_in_flight(
    settings: Settings, store_for: TaskStore
) -> None:
    """The task ends while its preliminary webhook is being answered (slowly): the
    terminal webhook arrives after that answer, never before it."""
    async with Receiver(["slow", 200]) as receiver:
        task = Task(id=_ids.new_id(), prompt="x", samples_planned=1,
                    callback=CallbackInfo(url=receiver.url))  # fmt: skip
        task, _ = await store_for.create_task(task, Admission(max_pending=100))
        task.status = TaskStatus.running
        assert await store_for.update_task(
            task, [("status", {"status": "running"}), ("preliminary", {"answer": "41"})]
        )
        async with sending(store_for, sender_settings(settings)):
            await asyncio.wait_for(receiver.arrived.get(), 10)  # the preliminary is in flight
            task = await store_for.get_task(task.id)
            assert task is not None
            task.status, task.finished_at = TaskStatus.failed, utcnow()
            assert await store_for.update_task(task, [("result", task.to_public())])
            await outbox_drained(store_for)
    payloads = [verify(h, b, SECRET) for h, b in receiver.requests]
    assert [(p["type"], p["data"]["status"]) for p in payloads] == [
        ("task.preliminary", "running"),
        ("task.failed", "failed"),
    ]
    assert receiver.arrival_times[1] >= receiver.answered_times[0]


async def test_a_preliminary_not_sent_before_the_end_is_superseded(
    settings: Settings, store_for: TaskStore
) -> None:
    before = outcomes()
    async with Receiver([500, 200]) as receiver:
        task = await finished_task(store_for, receiver.url, TaskStatus.failed, preliminary=True)
        async with sending(store_for, sender_settings(settings, webhook_max_per_host=1)):
            await outbox_drained(store_for)
    record = await delivery(store_for, task.id, "task.preliminary")
    failed = await delivery(store_for, task.id, "task.failed")
    # one of the two failed first; a preliminary is not retried once the task has ended
    assert (record.error or "").startswith("gave up") or failed.attempts == 2
    assert sum(delta(before).values()) == len(receiver.requests) + ("superseded" in delta(before))


async def test_a_ready_body_is_sent_as_given_with_its_own_secret(
    settings: Settings, store_for: TaskStore
) -> None:
    """The generic row (as the OpenAI-shaped webhooks use it): body and secret of its own."""
    own = generate_secret()
    body = {"object": "event", "id": "evt_1", "type": "batch.completed", "data": {"id": "b1"}}
    async with Receiver([200]) as receiver:
        await store_for.enqueue_deliveries(
            [
                OutboxEntry(
                    webhook_id="evt_1", event="batch.completed", url=receiver.url,
                    body=body, secret=own,
                ),
                # a task that is gone (expired): dropped, nothing sent
                OutboxEntry(
                    webhook_id="msg_gone", event="task.completed", url=receiver.url,
                    task_id="1764412800123-nope-1",
                ),
            ]
        )  # fmt: skip
        async with sending(store_for, sender_settings(settings)):
            await outbox_drained(store_for)
    ((headers, raw),) = receiver.requests
    assert verify(headers, raw, own) == body and headers["webhook-id"] == "evt_1"
    with pytest.raises(WebhookVerificationError):
        verify(headers, raw, SECRET)


async def test_attempts_are_bounded_per_host(settings: Settings, store_for: TaskStore) -> None:
    async with Receiver(["slow"]) as receiver:
        tasks = [await finished_task(store_for, receiver.url) for _ in range(6)]
        config = sender_settings(settings, webhook_max_per_host=2)
        async with sending(store_for, config):
            await outbox_drained(store_for)
    assert receiver.ids() == {webhook_id(t.id, "task.completed") for t in tasks}
    assert receiver.most_concurrent == 2


# --- through the whole service --------------------------------------------------------
async def settled_delivery(
    client: httpx.AsyncClient, task_id: str, event: str | tuple[str, ...], timeout_s: float = 20
) -> dict[str, Any]:
    """The task's delivery record of ``event`` once it needs no more attempts (a webhook
    record is written without an event, so this reads the task until it shows)."""
    task: dict[str, Any] = {}
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                task = (await client.get(f"/v1/tasks/{task_id}")).json()
                for record in task["callback"]["deliveries"]:
                    settled = record["delivered"] or record["status_code"] == 410
                    if (
                        record["event"] in ((event,) if isinstance(event, str) else event)
                        and settled
                    ):
                        return dict(record)
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"no settled {event} delivery: {task}") from None


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_webhooks_through_the_service(redis_url: str, key_prefix: str) -> None:
    """`ponder api` + `ponder worker` over Redis: the worker signs and sends the webhooks."""
    from tests.api.test_events import split_service

    env = {
        "PONDER_WEBHOOK_SECRET": SECRET,
        "PONDER_WEBHOOK_RETRY_S": "0.05,0.05,0.05",
        "PONDER_CALLBACK_ALLOW_PRIVATE": "true",
    }
    flaky, gone, steady = Receiver([500, 503, 200]), Receiver([410]), Receiver([200])
    async with (
        flaky,
        gone,
        steady,
        split_service(redis_url, key_prefix, **env) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        # fails twice, then succeeds: three attempts, one webhook-id (fast mode: no
        # task.preliminary webhook takes one of the receiver's answers)
        body = {"prompt": "[[answers: 4, 2, 4]]", "callback_url": flaky.url, "mode": "fast"}
        task = (await c.post("/v1/tasks", json=body)).json()
        record = await settled_delivery(c, task["id"], "task.completed")
        assert (record["attempts"], record["status_code"], record["delivered"]) == (3, 200, True)
        assert len(flaky.requests) == 3
        assert flaky.ids() == {webhook_id(task["id"], "task.completed")}
        for headers, raw in flaky.requests:
            payload = verify(headers, raw, SECRET)
            assert payload["type"] == "task.completed" and payload["data"]["status"] == "done"
            assert payload["data"]["result"]["answer"] == "4"
        # 410: one attempt, no retry
        body = {"prompt": "[[fail]]", "callback_url": gone.url}
        task = (await c.post("/v1/tasks", json=body)).json()
        record = await settled_delivery(c, task["id"], "task.failed")
        assert (record["attempts"], record["status_code"], record["delivered"]) == (1, 410, False)
        assert len(gone.requests) == 1
        # a cancel is announced too
        body = {"prompt": "[[hang]]", "callback_url": steady.url}
        task = (await c.post("/v1/tasks", json=body)).json()
        assert (await c.delete(f"/v1/tasks/{task['id']}")).status_code == 200
        await settled_delivery(c, task["id"], "task.cancelled")
        assert verify(*steady.requests[-1], SECRET)["data"]["status"] == "cancelled"


async def test_preliminary_webhook_through_the_service(settings: Settings) -> None:
    """Deep mode: the first finished sample's answer goes out as task.preliminary while
    the other samples run (one at a time here), then task.completed."""
    config = sender_settings(settings).model_copy(update={"engine_max_rows": 1})
    async with (
        Receiver([200]) as receiver,
        LiveServer(config, workers=1) as live,
        httpx.AsyncClient(base_url=live.url, timeout=30) as c,
    ):
        body = {"prompt": "[[answers: 5, 5, 4, 5, 5]] [[sleep_ms: 40]]", "mode": "deep",
                "callback_url": receiver.url}  # fmt: skip
        task = (await c.post("/v1/tasks", json=body)).json()
        terminal = ("task.completed", "task.partial")
        final = await settled_delivery(c, task["id"], terminal, timeout_s=8)
        preliminary = await settled_delivery(c, task["id"], "task.preliminary", timeout_s=8)
        done = (await c.get(f"/v1/tasks/{task['id']}")).json()
    assert final["attempts"] == preliminary["attempts"] == 1
    payloads = [verify(h, b, SECRET) for h, b in receiver.requests]
    assert [p["type"] for p in payloads] == ["task.preliminary", "task.completed"]
    assert payloads[0]["data"]["preliminary"]["answer"] == "5"
    assert done["status"] == "done"
    assert done["attempts"] == 1  # started once: the webhook's record did not abandon the run


OUTAGE_S = 30.0


@pytest.mark.slow
@pytest.mark.timeout(OUTAGE_S + 120)
async def test_a_dead_receiver_holds_no_worker_and_loses_no_event(redis_settings: Settings) -> None:
    """50 tasks with callbacks while the receiver is down for 30 s (a short retry schedule,
    scaled down from a 2-minute outage: the same scenario): every queue entry is
    acknowledged when its task ends, new tasks are claimed at the normal pace meanwhile,
    and once the receiver is back every event arrives exactly once per webhook-id."""
    from tests.test_reliability import free_port

    port = free_port()  # nothing listens there: the receiver is down
    url = f"http://127.0.0.1:{port}/hooks/ponder"
    config = sender_settings(
        redis_settings, webhook_retry_s=[0.5, 1, 2, *([4] * 17)], worker_max_tasks=32
    )
    fast = {"mode": "fast"}
    async with (
        LiveServer(config, workers=1) as live,
        httpx.AsyncClient(base_url=live.url, timeout=30) as c,
    ):

        async def probe() -> float:
            """Seconds from submit to end of a task without callback."""
            t0 = time.monotonic()
            task = (await c.post("/v1/tasks", json={"prompt": "probe", **fast})).json()
            assert (await wait_for_task(c, task["id"]))["status"] == "done"
            return time.monotonic() - t0

        before = [await probe() for _ in range(3)]
        down_at = time.monotonic()
        body = {"prompt": "[[answers: 1]]", "callback_url": url, **fast}
        ids = [(await c.post("/v1/tasks", json=body)).json()["id"] for _ in range(50)]
        for task_id in ids:
            assert (await wait_for_task(c, task_id, timeout_s=30))["status"] == "done"
        assert await pending_queue_entries(config) == 0  # no claim is held for a webhook
        during = []
        while time.monotonic() - down_at < OUTAGE_S:
            during.append(await probe())
            await asyncio.sleep(1)
        outbox = (await c.get("/metrics")).text
        assert "ponder_webhook_outbox_depth 50.0" in outbox  # all still waiting
        async with Receiver([200], port=port) as receiver:
            store = live.app.state.ponder.store
            await outbox_drained(store, timeout_s=60)
        records = [(await c.get(f"/v1/tasks/{i}")).json()["callback"]["deliveries"] for i in ids]
    print(f"submit-to-done before {max(before):.2f} s, during the outage max {max(during):.2f} s")
    assert max(during) < max(2.0, 4 * max(before)), (before, during)
    arrived = Counter(headers["webhook-id"] for headers, _ in receiver.requests)
    assert arrived == {webhook_id(i, "task.completed"): 1 for i in ids}
    for (record,) in records:
        assert record["delivered"] and record["status_code"] == 200
        assert record["attempts"] > 5  # it kept trying through the outage


async def pending_queue_entries(settings: Settings) -> int:
    """Queue entries claimed and not yet acknowledged, over every priority level."""
    import redis.asyncio as aioredis

    assert settings.redis_url
    raw = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        counts = [
            (await raw.xpending(f"{settings.key_prefix}:q:{p}", "workers"))["pending"]
            for p in range(6)
        ]
    finally:
        await raw.aclose()
    return sum(counts)
