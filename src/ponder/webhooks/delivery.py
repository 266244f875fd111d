"""Webhook delivery: the loop that sends the outbox's due webhooks and records them.

:class:`WebhookSender`, the delivery loop every worker process runs, claims due entries
of the durable outbox (:mod:`ponder.store.deliveries`) under a lease, checks each URL again
(:mod:`ponder.webhooks.guard`), POSTs the signed body (:mod:`ponder.webhooks.signing`)
and ends the entry or schedules its next attempt, recording every attempt on the task
(``task.callback.deliveries``). A task's webhooks go out one at a time, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import httpx

from ponder import metrics
from ponder.aio import cancel_and_wait
from ponder.errors import RecoverableError
from ponder.states import is_terminal
from ponder.store.base import HostRoom, Liveness, Notice, Outbox, TaskEvents
from ponder.store.deliveries import PRELIMINARY, OutboxEntry, webhook_id
from ponder.types import CallbackInfo, Delivery, Task, utcnow
from ponder.version import __version__
from ponder.webhooks.guard import check_callback_url
from ponder.webhooks.signing import signed_headers

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = ["SenderStore", "WebhookSender"]

log = logging.getLogger("ponder.webhooks")


class SenderStore(TaskEvents, Outbox, Liveness, Protocol):
    """What delivery uses of the store: the outbox, the tasks' records (each delivery is
    recorded on its task) and notices, and the delivery loop's lease."""


_CAS_RETRIES = 20
_ERROR_SNIPPET = 200
_JITTER = 0.2  # each retry delay is drawn from [d * 0.8, d * 1.2]
_GAVE_UP = "gave up: "  # the error prefix of a delivery abandoned before its schedule ended
#: the delivery loop looks at the outbox at least this often (in case a notice was missed)
_RECHECK_S = 5.0
_NOTICE_BLOCK_MS = 5000
_BACKOFF_S = (0.05, 2.0)  # first and longest wait after a store error
#: a task's webhook whose other one is being sent by another process is due again after this
_IN_ORDER_RETRY_S = 0.5


class WebhookSender:
    """The delivery loop of one process: sends the outbox's due webhooks on schedule.

    :meth:`start` begins two background tasks, owned here and ended by :meth:`close`:
    one claims due entries (:meth:`~ponder.store.contract.Outbox.claim_deliveries`, under
    a lease) and sends each in a task of its own, at most ``webhook_max_in_flight`` at
    once and ``webhook_max_per_host`` to one host; the other waits for
    :attr:`~ponder.store.base.Notice.outbox`, so that a new entry goes out at once.

    One attempt is bounded by ``webhook_timeout_s`` (the SSRF check included). A 2xx or
    a 410 ends the entry, as does the last attempt of the schedule (1 +
    ``len(webhook_retry_s)``); any other answer or a timeout makes it due again after
    the next delay of ``webhook_retry_s`` (±20% jitter), its attempt count stored with
    it, so a restart keeps the schedule. A process that dies mid-attempt leaves the entry
    leased: another loop takes it when the lease lapses and resends it with the same
    ``webhook-id``. Any number of processes run this loop over one store.

    The owner calls :meth:`close` (which also closes the HTTP client it made, not one given).
    """

    def __init__(
        self,
        store: SenderStore,
        settings: Settings,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.store = store
        self._secret = (
            settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
        )
        self._delays_s = list(settings.webhook_retry_s)
        self._timeout_s = settings.webhook_timeout_s
        self._max_bytes = settings.webhook_max_response_bytes
        self._allow_private = settings.callback_allow_private
        self._max_in_flight = settings.webhook_max_in_flight
        self._per_host = settings.webhook_max_per_host
        self._grace_s = settings.shutdown_grace_s
        #: names this loop's leases in the outbox
        self.consumer = f"{settings.node_id}-webhooks"
        # an attempt takes at most webhook_timeout_s; the lease also covers the store
        # calls around it, so a live loop is not overtaken
        self.lease_s = settings.webhook_timeout_s + 2 * settings.store_timeout_s + 1
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,  # a redirect could lead past the SSRF guard
            trust_env=False,  # the guard checks the address actually connected to
            headers={"user-agent": f"ponder-webhooks/{__version__}"},
        )
        self._rng = random.Random()
        self._sending: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> (host, job)
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    @property
    def max_attempts(self) -> int:
        return 1 + len(self._delays_s)

    async def start(self) -> None:
        """Start sending (idempotent)."""
        if self._loops:
            return
        self._loops = [
            asyncio.create_task(self._dispatch_loop(), name=f"{self.consumer}-dispatch"),
            asyncio.create_task(self._notice_loop(), name=f"{self.consumer}-notices"),
        ]

    async def close(self) -> None:
        """Stop claiming; attempts in flight get ``shutdown_grace_s``, then are cancelled
        and their entries handed back, due at once for another process."""
        loops, self._loops = self._loops, []
        await cancel_and_wait(loops)
        jobs = [job for _, job in self._sending.values()]
        if jobs:
            _, still = await asyncio.wait(jobs, timeout=self._grace_s)
            await cancel_and_wait(still)
        if self._owns_client:
            await self._client.aclose()

    # --- the loops --------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        delay_s = _BACKOFF_S[0]
        while True:
            self._wake.clear()
            wait_s = _RECHECK_S
            room = self._max_in_flight - len(self._sending)
            if room > 0:
                try:
                    entries, next_due_s = await self.store.claim_deliveries(
                        self.consumer, room, self.lease_s, self._host_room()
                    )
                except RecoverableError as e:
                    log.warning("webhook outbox: %s; retrying in %.2fs", e, delay_s)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, _BACKOFF_S[1])
                    continue
                delay_s = _BACKOFF_S[0]
                for entry in entries:
                    self._spawn(entry)
                if entries:
                    continue  # more may be due
                if next_due_s is not None and next_due_s > 0:
                    wait_s = min(wait_s, next_due_s)
            # woken early by a notice of new entries, or a finished attempt (room again)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()

    async def _notice_loop(self) -> None:
        """Wake the dispatcher when entries are added (store errors are its to report)."""
        cursor: str | None = None
        delay_s = _BACKOFF_S[0]
        while True:
            try:
                cursor, added = await self.store.read_notices(
                    Notice.outbox, cursor, _NOTICE_BLOCK_MS
                )
            except RecoverableError as e:
                log.debug("webhook outbox notices: %s", e)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, _BACKOFF_S[1])
                continue
            delay_s = _BACKOFF_S[0]
            if added:
                self._wake.set()

    def _host_room(self) -> HostRoom:
        busy = Counter(host for host, _ in self._sending.values())
        return HostRoom(self._per_host, {host: self._per_host - n for host, n in busy.items()})

    def _spawn(self, entry: OutboxEntry) -> None:
        if entry.webhook_id in self._sending:
            return  # already being sent here (its lease lapsed under a slow store)
        job = asyncio.create_task(self._send(entry), name=f"webhook-{entry.webhook_id}")
        self._sending[entry.webhook_id] = (entry.host, job)

        def finished(t: asyncio.Task[None]) -> None:
            self._sending.pop(entry.webhook_id, None)
            self._wake.set()
            if not t.cancelled() and t.exception() is not None:
                log.error("webhook %s: unexpected error", entry.webhook_id, exc_info=t.exception())

        job.add_done_callback(finished)

    # --- one attempt ------------------------------------------------------------------
    async def _send(self, entry: OutboxEntry) -> None:
        """One attempt of ``entry``, then end it or schedule the next one."""
        try:
            if entry.task_id is None:
                await self._attempt(entry)
            else:
                await self._attempt_in_order(entry, entry.task_id)
        except asyncio.CancelledError:  # shutdown: hand the entry back
            with contextlib.suppress(RecoverableError):
                await asyncio.shield(self.store.retry_delivery(self.consumer, entry, 0))
            raise
        except RecoverableError as e:
            log.warning(
                "webhook %s: %s; it is sent again when its lease (%.0fs) lapses",
                entry.webhook_id,
                e,
                self.lease_s,
            )

    async def _attempt_in_order(self, entry: OutboxEntry, task_id: str) -> None:
        """An attempt of a task's webhook while no other webhook of the task is being sent
        (a lease per task): a terminal event waits for a preliminary one in flight here,
        and is due again shortly when another process holds the lease."""
        if entry.event != PRELIMINARY:
            earlier = self._sending.get(webhook_id(task_id, PRELIMINARY))
            if earlier is not None:  # bounded: an attempt ends within the lease
                await asyncio.wait({earlier[1]}, timeout=self.lease_s)
        lease = f"webhooks:{task_id}"
        if not await self.store.acquire_lease(lease, entry.webhook_id, self.lease_s):
            await self.store.retry_delivery(self.consumer, entry, _IN_ORDER_RETRY_S)
            return
        try:
            await self._attempt(entry)
        finally:
            with contextlib.suppress(RecoverableError):
                await self.store.release_lease(lease, entry.webhook_id)

    async def _attempt(self, entry: OutboxEntry) -> None:
        if entry.task_id is not None:
            task = await self.store.get_task(entry.task_id)
            if task is None or task.callback is None:
                await self.store.finish_delivery(entry.webhook_id)  # expired: nobody to tell
                return
            if entry.event == PRELIMINARY and is_terminal(task.status):
                # its body would show the end, after (or racing) the terminal webhook's
                await self._give_up(entry, "the task ended before it was sent", "superseded")
                return
            body = _task_body(task, entry.event)
        else:
            body = json.dumps(entry.body, separators=(",", ":")).encode()
        secret = entry.secret or self._secret
        if secret is None:
            await self._give_up(entry, "no webhook secret is configured", "unconfigured")
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await check_callback_url(entry.url, self._allow_private)
                status, error = await self._post(entry.url, entry.webhook_id, body, secret)
        except ValueError as e:
            await self._give_up(entry, str(e), "refused")
            return
        except TimeoutError:
            status, error = None, f"timed out after {self._timeout_s:g}s"
        attempts = entry.attempts + 1
        delivered = status is not None and 200 <= status < 300
        stop = delivered or status == 410 or attempts >= self.max_attempts
        outcome = (
            "delivered" if delivered
            else "gone" if status == 410
            else "exhausted" if stop
            else "failed"
        )  # fmt: skip
        metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        log.log(
            logging.INFO if delivered else logging.WARNING,
            "webhook %s %s, attempt %d/%d: %s",
            entry.event,
            entry.webhook_id,
            attempts,
            self.max_attempts,
            outcome if error is None else f"{outcome} ({error})",
        )
        if entry.task_id is not None:
            await self._record(
                entry.task_id, entry.event, _attempt_result(attempts, status, error, delivered)
            )
        if stop:
            await self.store.finish_delivery(entry.webhook_id)
        else:
            entry.attempts = attempts
            await self.store.retry_delivery(self.consumer, entry, self._delay_s(attempts - 1))

    # --- helpers ----------------------------------------------------------------------
    def _delay_s(self, retry: int) -> float:
        base = self._delays_s[min(retry, len(self._delays_s) - 1)]
        return base * self._rng.uniform(1 - _JITTER, 1 + _JITTER)

    async def _post(
        self, url: str, msg_id: str, body: bytes, secret: str
    ) -> tuple[int | None, str | None]:
        """One POST: (status code or None, error or None). Reads back at most the cap."""
        headers = {"content-type": "application/json", **signed_headers(secret, msg_id, body)}
        try:
            async with self._client.stream("POST", url, content=body, headers=headers) as response:
                received = bytearray()
                async for chunk in response.aiter_bytes():
                    received += chunk[: self._max_bytes - len(received)]
                    if len(received) >= self._max_bytes:
                        break
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if 200 <= response.status_code < 300:
            return response.status_code, None
        snippet = bytes(received[:_ERROR_SNIPPET]).decode(errors="replace").strip()
        return response.status_code, f"HTTP {response.status_code}" + (
            f": {snippet}" if snippet else ""
        )

    async def _give_up(self, entry: OutboxEntry, why: str, outcome: str) -> None:
        def apply(d: Delivery) -> bool:
            d.error = _GAVE_UP + why
            return True

        if entry.task_id is not None:
            await self._record(entry.task_id, entry.event, apply)
        await self.store.finish_delivery(entry.webhook_id)
        metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        log.warning("webhook %s %s %s%s", entry.event, entry.webhook_id, _GAVE_UP, why)

    async def _record(self, task_id: str, event: str, apply: Callable[[Delivery], bool]) -> None:
        """Find (or create) the event's delivery record, apply a change, write it back.

        A compare-and-set write: on a revision conflict the task is read again and the
        change applied again. Writes no event (the SSE stream ends at the terminal one),
        and works on terminal tasks. Nothing when the task is gone; after too many
        conflicts the change is logged and dropped (the next attempt writes again).
        """
        for _ in range(_CAS_RETRIES):
            task = await self.store.get_task(task_id)
            if task is None or task.callback is None:
                return
            delivery, created = _delivery_of(task.callback, task_id, event)
            if not apply(delivery) and not created:
                return
            if await self.store.update_task(task):
                return
        log.warning("webhook %s of task %s: the record kept changing; not recorded", event, task_id)


def _task_body(task: Task, event: str) -> bytes:
    """The body of a task's webhook: ``{"type", "timestamp", "data": Task}``."""
    occurred = task.finished_at if event != PRELIMINARY and task.finished_at else None
    payload = {
        "type": event,
        "timestamp": (occurred or utcnow()).isoformat().replace("+00:00", "Z"),
        "data": task.to_public(),
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _attempt_result(
    attempts: int, status: int | None, error: str | None, delivered: bool
) -> Callable[[Delivery], bool]:
    """The change that records one attempt (never lowering what another worker wrote)."""

    def apply(d: Delivery) -> bool:
        d.attempts = max(d.attempts, attempts)
        d.status_code = status
        d.delivered = d.delivered or delivered
        d.error = None if d.delivered else error
        return True

    return apply


def _delivery_of(callback: CallbackInfo, task_id: str, event: str) -> tuple[Delivery, bool]:
    for delivery in callback.deliveries:
        if delivery.event == event:
            return delivery, False
    delivery = Delivery(event=event, webhook_id=webhook_id(task_id, event))
    callback.deliveries.append(delivery)
    return delivery, True
