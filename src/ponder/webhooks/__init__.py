"""Webhooks: Standard Webhooks signatures, the SSRF guard, and the delivery loop.

A task with a ``callback_url`` gets a POST on ``task.preliminary`` and on its terminal
event (``task.completed``, ``task.partial``, ``task.failed``, ``task.cancelled``,
``task.expired``).
Headers follow https://www.standardwebhooks.com: ``webhook-id`` (the same on every
retry of one event, so receivers de-duplicate on it), ``webhook-timestamp`` and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``).
Signing and verification use the ``standardwebhooks`` package (the reference
implementation of the spec), so a receiver may verify with it or with :func:`verify`.

Delivery goes through a durable outbox (:mod:`ponder.store.deliveries`): the task write that
causes a webhook also stores it, and :class:`WebhookSender`, the delivery loop every
worker process runs, sends it on the retry schedule, recording every attempt on the task
(``task.callback.deliveries``). Delivery is at least once, de-duplicated by
``webhook-id``: only a process that dies between a receiver's answer and the store's
record of it makes an event arrive twice.

A task's webhooks arrive in order: one attempt at a time per task (a store lease named
by the task, across processes), and a ``task.preliminary`` not sent before the task
ended is dropped (recorded "gave up"): no preliminary webhook arrives after its task's
terminal one, and none carries a terminal status.

Receivers::

    from ponder.webhooks import WebhookVerificationError, verify

    payload = verify(request.headers, raw_body, "whsec_...")  # raises if forged
"""

from ponder.store.deliveries import EVENTS, terminal_event, webhook_id
from ponder.webhooks.delivery import WebhookSender
from ponder.webhooks.guard import check_callback_url
from ponder.webhooks.signing import (
    WebhookVerificationError,
    generate_secret,
    sign,
    signed_headers,
    verify,
)

__all__ = [
    "EVENTS",
    "WebhookSender",
    "WebhookVerificationError",
    "check_callback_url",
    "generate_secret",
    "sign",
    "signed_headers",
    "terminal_event",
    "verify",
    "webhook_id",
]
