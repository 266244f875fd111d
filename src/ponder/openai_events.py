"""Webhooks in OpenAI's shape for responses and batches, signed per Standard Webhooks.

Events: ``response.completed|failed|cancelled|incomplete`` for background responses and
``batch.completed|failed|expired|cancelled`` for batches that have a webhook URL (their
own ``webhook_url``, else ``PONDER_WEBHOOK_URL``). The payload is thin, as OpenAI's::

    {"id": "evt_…", "object": "event", "type": "batch.completed",
     "created_at": 1764412800, "data": {"id": "batch_…"}}

and the receiver fetches the object. Headers are those of task webhooks (``webhook-id``
= the event id, the same on every retry; ``webhook-timestamp``; ``webhook-signature``
with ``PONDER_WEBHOOK_SECRET``), so the official SDK's
``client.webhooks.unwrap(body, headers, secret=…)`` accepts them.

:func:`enqueue_event` is the one place that hands an event to delivery. Until the
store's webhook outbox (issue 13) lands, events wait as store objects of kind ``event``
and :class:`EventOutbox` (run by the batch feeder, under its lease) sends each through
the task webhooks' :class:`~ponder.webhooks.WebhookSender` (its SSRF guard, signing,
retry delays with jitter, 410 stops) and records every attempt on the event. Delivery is
at least once: an event is created once (its id is derived from the object and the
type), and one interrupted by a crash is sent again by the next lease holder.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

from ponder import metrics
from ponder.config import Settings
from ponder.errors import RecoverableError
from ponder.store.base import StoredObject, TaskStore
from ponder.types import TaskStatus
from ponder.webhooks import WebhookSender, check_callback_url

__all__ = ["BATCH_EVENTS", "KIND", "RESPONSE_EVENTS", "EventOutbox", "enqueue_event"]

log = logging.getLogger("ponder.webhooks")

KIND = "event"

RESPONSE_EVENTS = {
    TaskStatus.done: "response.completed",
    TaskStatus.partial_done: "response.incomplete",
    TaskStatus.failed: "response.failed",
    TaskStatus.cancelled: "response.cancelled",
}
#: a batch's final status → its event
BATCH_EVENTS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}
_MAX_SENDING = 16  # deliveries in progress at once


async def enqueue_event(
    store: TaskStore, settings: Settings, *, url: str, event_type: str, object_id: str
) -> None:
    """Hand the event ``event_type`` of ``object_id`` to delivery to ``url`` (once: an
    event already handed over is not made again)."""
    event_id = f"evt_{object_id}_{event_type.replace('.', '_')}"
    payload = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created_at": int(time.time()),
        "data": {"id": object_id},
    }
    record = {
        "url": url,
        "body": json.dumps(payload, separators=(",", ":")),
        "attempts": 0,
        "next_at": 0.0,
        "delivered": False,
        "done": False,
        "status_code": None,
        "error": None,
    }
    keep_s = settings.task_ttl_s + sum(settings.webhook_retry_s)
    obj = StoredObject(KIND, event_id, "", f"{time.time_ns():020d}", record, active=True)
    if await store.create_object(obj, ttl_s=keep_s):
        log.info("webhook %s of %s queued for %s", event_type, object_id, url)


class EventOutbox:
    """Sends the queued events that are due (see the module docstring).

    :meth:`send_due` starts at most 16 deliveries at once and returns; each attempt
    writes its outcome and the time of the next one on the event. :meth:`close` cancels
    the attempts in flight (an attempt cut short is made again later).
    """

    def __init__(self, store: TaskStore, settings: Settings, sender: WebhookSender) -> None:
        self.store = store
        self.sender = sender
        self._has_secret = settings.webhook_secret is not None
        self._allow_private = settings.callback_allow_private
        self._sending: dict[str, asyncio.Task[None]] = {}

    async def send_due(self) -> None:
        now = time.time()
        for event_id in await self.store.active_objects(KIND):
            if len(self._sending) >= _MAX_SENDING:
                return
            if event_id in self._sending:
                continue
            obj = await self.store.get_object(KIND, event_id)
            if obj is None or not obj.active or obj.data["next_at"] > now:
                continue
            job = asyncio.create_task(self._attempt(obj), name=f"webhook-{event_id}")
            self._sending[event_id] = job
            job.add_done_callback(functools.partial(self._done, event_id))

    def _done(self, event_id: str, job: asyncio.Task[None]) -> None:
        self._sending.pop(event_id, None)
        if not job.cancelled() and job.exception() is not None:
            log.error("webhook %s: unexpected error", event_id, exc_info=job.exception())

    async def close(self) -> None:
        jobs = list(self._sending.values())
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    async def _attempt(self, obj: StoredObject) -> None:
        try:
            await self._send(obj.id, obj.data)
            obj.active = not obj.data["done"]
            if not await self.store.update_object(obj):
                log.warning("webhook %s: its record changed; the attempt is not recorded", obj.id)
        except RecoverableError as e:
            log.warning("webhook %s: %s", obj.id, e)

    async def _send(self, event_id: str, record: dict[str, Any]) -> None:
        """One attempt; its outcome (and whether another follows) written into ``record``."""
        why = None if self._has_secret else "no webhook secret is configured"
        if why is None:
            try:
                await check_callback_url(record["url"], self._allow_private)
            except ValueError as e:
                why = str(e)
        if why is not None:
            record.update(done=True, error=f"gave up: {why}")
            metrics.WEBHOOK_DELIVERIES.labels(outcome="refused").inc()
            log.warning("webhook %s gave up: %s", event_id, why)
            return
        # the task webhooks' own attempt: signing, the HTTP call, the answer read back
        status, error = await self.sender._attempt(record["url"], event_id, record["body"].encode())
        delivered = status is not None and 200 <= status < 300
        record["attempts"] += 1
        record.update(status_code=status, delivered=delivered, error=error)
        record["done"] = (
            delivered or status == 410 or record["attempts"] >= self.sender.max_attempts
        )
        if record["done"]:
            outcome = "delivered" if delivered else "gone" if status == 410 else "exhausted"
        else:
            record["next_at"] = time.time() + self.sender._delay_s(record["attempts"] - 1)
            outcome = "failed"
        metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        log.log(
            logging.INFO if delivered else logging.WARNING,
            "webhook %s, attempt %d/%d: %s",
            event_id,
            record["attempts"],
            self.sender.max_attempts,
            outcome if error is None else f"{outcome} ({error})",
        )
