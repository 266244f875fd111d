"""Webhooks: signatures, the SSRF guard, and delivery to a real receiver on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import standardwebhooks
import uvicorn

from ponder import metrics
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.store import TaskStore, create_store
from ponder.types import CallbackInfo, Delivery, Result, Task, TaskStatus, utcnow
from ponder.webhooks import (
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
from tests.conftest import LiveServer, start_uvicorn

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
    ``"hang"`` (answer only when the receiver stops) or ``"endless"`` (200 with a body
    far over any read cap).
    """

    def __init__(self, script: list[int | str]) -> None:
        self.script = script
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.arrived = asyncio.Queue[int]()
        self._release = asyncio.Event()
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=0,
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
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((headers, body))
        action = self.script[min(len(self.requests), len(self.script)) - 1]
        self.arrived.put_nowait(len(self.requests))
        if action == "hang":
            await self._release.wait()
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
    store = create_store(settings)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def finished_task(store: TaskStore, url: str, status: TaskStatus = TaskStatus.done) -> Task:
    """A task with a callback that has reached ``status`` (through running)."""
    task = Task(id=_ids.new_id(), prompt="x", samples_planned=1, callback=CallbackInfo(url=url))
    task, _ = await store.create_task(task, max_pending=100)
    task.status = TaskStatus.running
    assert await store.update_task(task, [("status", {"status": "running"})])
    task.status = status
    task.finished_at = utcnow()
    if status == TaskStatus.done:
        task.result = Result(answer="42", text="The answer is 42.", confidence=0.9, agreement=1.0,
                             votes={"42": 1}, chosen_sample=0)  # fmt: skip
    assert await store.update_task(task, [("result", task.to_public())])
    return task


def delivery(task: Task, event: str) -> Delivery:
    assert task.callback is not None
    (found,) = [d for d in task.callback.deliveries if d.event == event]
    return found


def outcomes() -> dict[str, float]:
    names = ("delivered", "failed", "gone", "exhausted", "refused", "unconfigured")
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
        sender = WebhookSender(store_for, sender_settings(settings))
        try:
            await sender.deliver(task.id, "task.completed")
        finally:
            await sender.close()
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
    record = delivery(stored, "task.completed")
    assert (record.attempts, record.status_code, record.delivered, record.error) == (
        3,
        200,
        True,
        None,
    )
    assert record.webhook_id == webhook_id(task.id, "task.completed")
    assert delta(before) == {"failed": 2, "delivered": 1}
    # delivered: a second call sends nothing more
    async with Receiver([200]) as again:
        sender = WebhookSender(store_for, sender_settings(settings))
        await sender.deliver(task.id, "task.completed")
        await sender.close()
    assert again.requests == []


async def test_410_stops_retrying(settings: Settings, store_for: TaskStore) -> None:
    before = outcomes()
    async with Receiver([410, 200]) as receiver:
        task = await finished_task(store_for, receiver.url, TaskStatus.failed)
        sender = WebhookSender(store_for, sender_settings(settings))
        await sender.deliver(task.id, "task.failed")
        await sender.deliver(task.id, "task.failed")  # a call after a 410 sends nothing
        await sender.close()
    assert len(receiver.requests) == 1
    stored = await store_for.get_task(task.id)
    assert stored is not None
    record = delivery(stored, "task.failed")
    assert (record.attempts, record.status_code, record.delivered) == (1, 410, False)
    assert delta(before) == {"gone": 1}


async def test_exhausted_schedule_and_timeouts(settings: Settings, store_for: TaskStore) -> None:
    before = outcomes()
    async with Receiver(["hang", 500]) as receiver:
        task = await finished_task(store_for, receiver.url, TaskStatus.cancelled)
        config = sender_settings(settings, webhook_retry_s=[0.01, 0.02], webhook_timeout_s=0.3)
        sender = WebhookSender(store_for, config)
        await sender.deliver(task.id, "task.cancelled")
        await sender.close()
    assert len(receiver.requests) == 3  # 1 + 2 retries, the first one timed out
    stored = await store_for.get_task(task.id)
    assert stored is not None
    record = delivery(stored, "task.cancelled")
    assert (record.attempts, record.status_code, record.delivered) == (3, 500, False)
    assert record.error is not None and record.error.startswith("HTTP 500")
    assert delta(before) == {"failed": 2, "exhausted": 1}


async def test_no_retries_when_the_schedule_is_empty(
    settings: Settings, store_for: TaskStore
) -> None:
    async with Receiver([500]) as receiver:
        task = await finished_task(store_for, receiver.url)
        sender = WebhookSender(store_for, sender_settings(settings, webhook_retry_s=[]))
        await sender.deliver(task.id, "task.completed")
        await sender.close()
    assert len(receiver.requests) == 1


async def test_reads_back_no_more_than_the_cap(settings: Settings, store_for: TaskStore) -> None:
    async with Receiver(["endless"]) as receiver:
        task = await finished_task(store_for, receiver.url)
        sender = WebhookSender(
            store_for, sender_settings(settings, webhook_max_response_bytes=1024)
        )
        await sender.deliver(task.id, "task.completed")
        await sender.close()
    stored = await store_for.get_task(task.id)
    assert stored is not None
    assert delivery(stored, "task.completed").delivered


async def test_resumes_after_a_crash_with_the_same_id(
    settings: Settings, store_for: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker dies between attempts; the next one resumes from the recorded count."""
    recorded = asyncio.Event()
    real_update = store_for.update_task

    async def update_task(task: Task, events: Any = ()) -> bool:
        written = await real_update(task, events)
        if written and task.callback and any(d.attempts for d in task.callback.deliveries):
            recorded.set()
        return written

    monkeypatch.setattr(store_for, "update_task", update_task)
    async with Receiver([500, 200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        first = WebhookSender(store_for, sender_settings(settings, webhook_retry_s=[3600, 0.01]))
        job = asyncio.create_task(first.deliver(task.id, "task.completed"))
        # the first attempt is recorded, then the sender waits an hour to retry...
        await asyncio.wait_for(recorded.wait(), 10)
        job.cancel()  # ...and its worker dies
        with pytest.raises(asyncio.CancelledError):
            await job
        await first.close()
        second = WebhookSender(store_for, sender_settings(settings, webhook_retry_s=[3600, 0.01]))
        await second.deliver(task.id, "task.completed")  # no hour-long wait: resumes at once
        await second.close()
    assert len(receiver.requests) == 2
    assert receiver.ids() == {webhook_id(task.id, "task.completed")}
    stored = await store_for.get_task(task.id)
    assert stored is not None
    record = delivery(stored, "task.completed")
    assert (record.attempts, record.status_code, record.delivered) == (2, 200, True)


async def test_refused_and_unconfigured_deliveries_send_nothing(
    settings: Settings, store_for: TaskStore
) -> None:
    before = outcomes()
    async with Receiver([200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        guarded = WebhookSender(store_for, sender_settings(settings, callback_allow_private=False))
        await guarded.deliver(task.id, "task.completed")
        await guarded.close()
        other = await finished_task(store_for, receiver.url)
        unsigned = WebhookSender(store_for, sender_settings(settings, webhook_secret=None))
        await unsigned.deliver(other.id, "task.completed")
        await unsigned.close()
    assert receiver.requests == []
    stored = await store_for.get_task(task.id)
    assert stored is not None
    record = delivery(stored, "task.completed")
    assert record.attempts == 0 and not record.delivered
    assert record.error is not None and "loopback" in record.error
    stored = await store_for.get_task(other.id)
    assert stored is not None
    assert "secret" in (delivery(stored, "task.completed").error or "")
    assert delta(before) == {"refused": 1, "unconfigured": 1}


async def test_concurrent_writers_keep_every_record(
    settings: Settings, store_for: TaskStore
) -> None:
    """Two events delivered at once: both records survive the compare-and-set races."""
    async with Receiver([200]) as receiver:
        task = await finished_task(store_for, receiver.url)
        sender = WebhookSender(store_for, sender_settings(settings))
        await asyncio.gather(
            sender.deliver(task.id, "task.preliminary"), sender.deliver(task.id, "task.completed")
        )
        await sender.close()
    stored = await store_for.get_task(task.id)
    assert stored is not None and stored.callback is not None
    assert {d.event: d.delivered for d in stored.callback.deliveries} == {
        "task.preliminary": True,
        "task.completed": True,
    }
    assert len(receiver.ids()) == 2


async def test_terminal_events_wait_for_a_terminal_task(
    settings: Settings, store_for: TaskStore
) -> None:
    async with Receiver([200]) as receiver:
        task = Task(id=_ids.new_id(), prompt="x", callback=CallbackInfo(url=receiver.url))
        task, _ = await store_for.create_task(task, max_pending=100)
        sender = WebhookSender(store_for, sender_settings(settings))
        await sender.deliver(task.id, "task.completed")  # still pending: nothing to say
        await sender.close()
    assert receiver.requests == []
    stored = await store_for.get_task(task.id)
    assert stored is not None and stored.callback is not None
    assert stored.callback.deliveries == [] and stored.rev == task.rev  # nothing written


async def test_tasks_without_callback_and_unknown_events(
    settings: Settings, store_for: TaskStore
) -> None:
    task, _ = await store_for.create_task(Task(id=_ids.new_id(), prompt="x"), max_pending=100)
    sender = WebhookSender(store_for, sender_settings(settings))
    await sender.deliver(task.id, "task.completed")  # nothing to do
    await sender.deliver("1764412800123-nope-1", "task.completed")  # unknown task
    with pytest.raises(ValueError, match="unknown webhook event"):
        await sender.deliver(task.id, "task.exploded")
    await sender.close()
    stored = await store_for.get_task(task.id)
    assert stored is not None and stored.callback is None


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
