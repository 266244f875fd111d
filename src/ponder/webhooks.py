"""Webhooks: Standard Webhooks signatures, the SSRF guard, and delivery with retries.

A task with a ``callback_url`` gets a POST on ``task.preliminary`` and on its terminal
event (``task.completed``, ``task.partial``, ``task.failed``, ``task.cancelled``).
Headers follow https://www.standardwebhooks.com: ``webhook-id`` (the same on every
retry of one event, so receivers de-duplicate on it), ``webhook-timestamp`` and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``).
Signing and verification use the ``standardwebhooks`` package (the reference
implementation of the spec), so a receiver may verify with it or with :func:`verify`.

Delivery is at least once: every attempt is recorded on the task
(``task.callback.deliveries``) with a compare-and-set write, and
:meth:`WebhookSender.deliver` called again for the same event (by a worker that
reclaimed the task after a crash) resumes from the recorded attempt count.

Receivers::

    from ponder.webhooks import WebhookVerificationError, verify

    payload = verify(request.headers, raw_body, "whsec_...")  # raises if forged
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from standardwebhooks import Webhook, WebhookVerificationError

from ponder import __version__, metrics
from ponder.types import CallbackInfo, Delivery, Task, TaskStatus, utcnow

if TYPE_CHECKING:
    from ponder.config import Settings
    from ponder.store.base import TaskStore

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

log = logging.getLogger("ponder.webhooks")

_TERMINAL_EVENTS = {
    TaskStatus.done: "task.completed",
    TaskStatus.partial_done: "task.partial",
    TaskStatus.failed: "task.failed",
    TaskStatus.cancelled: "task.cancelled",
}
#: every event a callback receives
EVENTS = frozenset({"task.preliminary", *_TERMINAL_EVENTS.values()})

_CAS_RETRIES = 20
_RESOLVE_TIMEOUT_S = 5.0
_ERROR_SNIPPET = 200
_JITTER = 0.2  # each retry delay is drawn from [d * 0.8, d * 1.2]
_GAVE_UP = "gave up: "  # the error prefix of a delivery abandoned before its schedule ended

# Cloud metadata endpoints: refused even when private addresses are allowed.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)


# --- events ---------------------------------------------------------------------------
def terminal_event(status: TaskStatus | str) -> str:
    """The webhook event of a terminal status (``done`` → ``task.completed``, …)."""
    try:
        return _TERMINAL_EVENTS[TaskStatus(status)]
    except (KeyError, ValueError):
        raise ValueError(f"{status!r} is not a terminal status") from None


def webhook_id(task_id: str, event: str) -> str:
    """The ``webhook-id`` of one event of one task: stable across retries and workers."""
    return f"msg_{task_id}_{event}"


# --- signatures -----------------------------------------------------------------------
def generate_secret() -> str:
    """A fresh signing secret in the ``whsec_<base64>`` form (32 random bytes)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256>`` of id.timestamp.body."""
    data = body.decode() if isinstance(body, bytes) else body
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), data)


def signed_headers(
    secret: str, msg_id: str, body: bytes | str, *, timestamp: int | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body`` (timestamp: now by default)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(secret, msg_id, ts, body),
    }


def verify(headers: Mapping[str, str], body: bytes | str, secret: str) -> dict[str, Any]:
    """Check a webhook's signature and timestamp (±5 minutes); return the parsed payload.

    ``headers`` is any mapping (a dict, ``httpx.Headers``, Starlette's ``request.headers``);
    ``body`` the raw bytes as received. Raises :class:`WebhookVerificationError` when a
    header is missing or malformed, the timestamp is too old or too new, no signature
    matches, or the body is not a JSON object.
    """
    plain = {str(k): str(v) for k, v in headers.items()}
    try:
        payload = Webhook(secret).verify(body, plain)
    except WebhookVerificationError:
        raise
    except ValueError as e:  # a malformed signature list, bad base64, a body not JSON
        raise WebhookVerificationError(f"malformed webhook: {e}") from e
    if not isinstance(payload, dict):
        raise WebhookVerificationError("the webhook body is not a JSON object")
    return payload


# --- the SSRF guard -------------------------------------------------------------------
def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a callback may not go to ``ip`` (None: a public address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            return _refusal(embedded)
    if ip in _METADATA:
        return "a cloud metadata address"
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("not public", not ip.is_global),
    )
    return next((f"a {name} address" for name, hit in checks if hit), None)


async def check_callback_url(url: str, allow_private: bool = False) -> None:
    """Refuse a callback URL that could reach the service's own network (SSRF).

    The host is resolved (in a thread, at most 5 s); every address it resolves to must
    be public, unless ``allow_private`` (then loopback and private addresses pass, but
    cloud metadata addresses never do). Raises ValueError with a message naming
    ``callback_url`` and saying why.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("callback_url: give an http(s) URL with a host")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError(f"callback_url: {e}") from e
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(_RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError) as e:
        raise ValueError(f"callback_url: the host {host!r} does not resolve ({e})") from e
    for *_, sockaddr in infos:
        address = str(sockaddr[0]).split("%", 1)[0]  # drop an IPv6 scope id
        ip = ipaddress.ip_address(address)
        reason = _refusal(ip)
        if reason is None or (allow_private and reason != "a cloud metadata address"):
            continue
        hint = "" if reason == "a cloud metadata address" else " (PONDER_CALLBACK_ALLOW_PRIVATE)"
        raise ValueError(
            f"callback_url: {host!r} resolves to {address}, {reason}; callbacks go to "
            f"public addresses only{hint}"
        )


# --- delivery -------------------------------------------------------------------------
class WebhookSender:
    """Sends a task's webhooks with retries, recording every attempt on the task.

    ``deliver`` runs the whole schedule (the first attempt, then one retry after each
    delay of ``settings.webhook_retry_s``, with ±20% jitter) and returns when the event
    is delivered (2xx), refused for good (410), or the schedule is spent. It is safe to
    call again for the same event: a delivered one is not sent again, an interrupted one
    resumes from its recorded attempt count (at once: a reclaim waited out the lease).
    Cancelling it (worker shutdown) loses nothing recorded.

    The owner calls :meth:`close` (which closes the HTTP client it made, not one given).
    """

    def __init__(
        self,
        store: TaskStore,
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
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,  # a redirect could lead past the SSRF guard
            trust_env=False,  # the guard checks the address actually connected to
            headers={"user-agent": f"ponder-webhooks/{__version__}"},
        )
        self._rng = random.Random()

    @property
    def max_attempts(self) -> int:
        return 1 + len(self._delays_s)

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def is_finished(self, delivery: Delivery) -> bool:
        """True when ``delivery`` needs no more attempts."""
        return (
            delivery.delivered
            or delivery.status_code == 410
            or delivery.attempts >= self.max_attempts
            or (delivery.error or "").startswith(_GAVE_UP)
        )

    async def deliver(self, task_id: str, event: str) -> None:
        """Send ``event`` of the task to its ``callback_url`` (see the class docstring)."""
        if event not in EVENTS:
            raise ValueError(f"unknown webhook event {event!r}; one of {sorted(EVENTS)}")
        task = await self.store.get_task(task_id)
        if task is None or task.callback is None:
            return  # gone, or nothing to send
        # the record is written with the first attempt's outcome (no write before it:
        # a preliminary webhook goes out while the worker still updates the task)
        delivery = next((d for d in task.callback.deliveries if d.event == event), None)
        delivery = delivery or Delivery(event=event, webhook_id=webhook_id(task_id, event))
        if self.is_finished(delivery):
            return
        if event != "task.preliminary" and not _is_terminal(task):
            log.warning("webhook %s of task %s: not sent, the task is %s", event, task_id,
                        task.status.value)  # fmt: skip
            return
        url = task.callback.url
        if self._secret is None:
            await self._give_up(task_id, event, "no webhook secret is configured", "unconfigured")
            return
        body = self._body(task, event)
        msg_id = delivery.webhook_id or webhook_id(task_id, event)
        attempts = delivery.attempts
        first = True
        while attempts < self.max_attempts:
            if not first:
                await asyncio.sleep(self._delay_s(attempts - 1))
            first = False
            try:
                await check_callback_url(url, self._allow_private)
            except ValueError as e:
                await self._give_up(task_id, event, str(e), "refused")
                return
            status, error = await self._attempt(url, msg_id, body)
            attempts += 1
            delivered = status is not None and 200 <= status < 300
            stop = delivered or status == 410 or attempts >= self.max_attempts

            found = await self._record(
                task_id, event, _attempt_result(attempts, status, error, delivered=delivered)
            )
            outcome = (
                "delivered" if delivered
                else "gone" if status == 410
                else "exhausted" if stop
                else "failed"
            )  # fmt: skip
            metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
            log.log(
                logging.INFO if delivered else logging.WARNING,
                "webhook %s of task %s, attempt %d/%d: %s",
                event,
                task_id,
                attempts,
                self.max_attempts,
                outcome if error is None else f"{outcome} ({error})",
            )
            if stop or found is None:
                return
            if event == "task.preliminary" and _is_terminal(found[0]):
                await self._give_up(task_id, event, "the task ended before a retry", "superseded")
                return

    # --- helpers ----------------------------------------------------------------------
    def _delay_s(self, retry: int) -> float:
        base = self._delays_s[min(retry, len(self._delays_s) - 1)]
        return base * self._rng.uniform(1 - _JITTER, 1 + _JITTER)

    def _body(self, task: Task, event: str) -> bytes:
        occurred = task.finished_at if event != "task.preliminary" and task.finished_at else None
        payload = {
            "type": event,
            "timestamp": (occurred or utcnow()).isoformat().replace("+00:00", "Z"),
            "data": task.to_public(),
        }
        return json.dumps(payload, separators=(",", ":")).encode()

    async def _attempt(self, url: str, msg_id: str, body: bytes) -> tuple[int | None, str | None]:
        """One POST: (status code or None, error or None). Reads back at most the cap."""
        assert self._secret is not None
        headers = {"content-type": "application/json", **signed_headers(self._secret, msg_id, body)}
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                self._client.stream("POST", url, content=body, headers=headers) as response,
            ):
                received = bytearray()
                async for chunk in response.aiter_bytes():
                    received += chunk[: self._max_bytes - len(received)]
                    if len(received) >= self._max_bytes:
                        break
        except TimeoutError:
            return None, f"timed out after {self._timeout_s:g}s"
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if 200 <= response.status_code < 300:
            return response.status_code, None
        snippet = bytes(received[:_ERROR_SNIPPET]).decode(errors="replace").strip()
        return response.status_code, f"HTTP {response.status_code}" + (
            f": {snippet}" if snippet else ""
        )

    async def _give_up(self, task_id: str, event: str, why: str, outcome: str) -> None:
        def apply(d: Delivery) -> bool:
            d.error = _GAVE_UP + why
            return True

        await self._record(task_id, event, apply)
        metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        log.warning("webhook %s of task %s %s%s", event, task_id, _GAVE_UP, why)

    async def _record(
        self, task_id: str, event: str, apply: Callable[[Delivery], bool]
    ) -> tuple[Task, Delivery] | None:
        """Find (or create) the event's delivery record, apply a change, write it back.

        A compare-and-set write: on a revision conflict the task is read again and the
        change applied again. Writes no event (the SSE stream ends at the terminal one),
        and works on terminal tasks. None when the task is gone or has no callback; the
        unwritten change after too many conflicts (logged: the next attempt writes again).
        """
        latest: tuple[Task, Delivery] | None = None
        for _ in range(_CAS_RETRIES):
            task = await self.store.get_task(task_id)
            if task is None or task.callback is None:
                return None
            delivery, created = _delivery_of(task.callback, task_id, event)
            latest = task, delivery
            if not apply(delivery) and not created:
                return latest
            if await self.store.update_task(task):
                return latest
        log.warning("webhook %s of task %s: the record kept changing; not recorded", event, task_id)
        return latest


def _attempt_result(
    attempts: int, status: int | None, error: str | None, *, delivered: bool
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


def _is_terminal(task: Task) -> bool:
    return task.status in _TERMINAL_EVENTS
