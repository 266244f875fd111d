"""Webhooks in OpenAI's shape for responses and batches, signed per Standard Webhooks.

Events: ``response.completed|failed|cancelled|incomplete`` for background responses (a
response whose task expired in the queue is ``response.failed``) and
``batch.completed|failed|expired|cancelled`` for batches that have a webhook URL (their
own ``webhook_url``, else ``PONDER_WEBHOOK_URL``). The payload is thin, as OpenAI's::

    {"id": "evt_…", "object": "event", "type": "batch.completed",
     "created_at": 1764412800, "data": {"id": "batch_…"}}

and the receiver fetches the object. Headers are those of task webhooks (``webhook-id``
= the event id, the same on every retry; ``webhook-timestamp``; ``webhook-signature``
with ``PONDER_WEBHOOK_SECRET``), so the official SDK's
``client.webhooks.unwrap(body, headers, secret=…)`` accepts them.

:func:`enqueue_event` hands an event to the store's webhook outbox
(:mod:`ponder.store.deliveries`): the delivery loop of every worker process sends it like a task
webhook (the SSRF guard, signing, retry delays with jitter, 410 stops, bounded
concurrency per process and per host). Delivery is at least once: an event is added once
(its id is derived from the object and the type), and one interrupted by a crash is
sent again when its lease lapses.
"""

from __future__ import annotations

import logging
import time

from ponder.openai.batches import BatchStatus
from ponder.store.base import Outbox
from ponder.store.deliveries import OutboxEntry
from ponder.types import TaskStatus

__all__ = ["BATCH_EVENTS", "RESPONSE_EVENTS", "enqueue_event"]

log = logging.getLogger("ponder.webhooks")

RESPONSE_EVENTS = {
    TaskStatus.done: "response.completed",
    TaskStatus.partial_done: "response.incomplete",
    TaskStatus.failed: "response.failed",
    TaskStatus.cancelled: "response.cancelled",
    TaskStatus.expired: "response.failed",  # not started within its queue_timeout_s
}
#: a batch's final status → its event
BATCH_EVENTS = {
    BatchStatus.completed: "batch.completed",
    BatchStatus.failed: "batch.failed",
    BatchStatus.expired: "batch.expired",
    BatchStatus.cancelled: "batch.cancelled",
}


async def enqueue_event(store: Outbox, *, url: str, event_type: str, object_id: str) -> None:
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
    entry = OutboxEntry(webhook_id=event_id, event=event_type, url=url, body=payload)
    await store.enqueue_deliveries([entry])
    log.info("webhook %s of %s queued for %s", event_type, object_id, url)
