"""Standard Webhooks signatures: a secret, the signed headers of a body, their check.

Headers follow https://www.standardwebhooks.com: ``webhook-id`` (the same on every retry
of one event, so receivers de-duplicate on it), ``webhook-timestamp`` and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``).
Signing and verification use the ``standardwebhooks`` package (the reference
implementation of the spec), so a receiver may verify with it or with :func:`verify`.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

__all__ = ["WebhookVerificationError", "generate_secret", "sign", "signed_headers", "verify"]


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
