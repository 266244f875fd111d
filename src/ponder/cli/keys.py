"""``ponder keys``: make API keys and webhook signing secrets."""

from __future__ import annotations

import secrets

from ponder.cli.base import console

__all__ = ["new", "webhook_secret"]


def new() -> None:
    """Print a fresh API key and the digest to put in PONDER_API_KEYS."""
    from ponder.api.deps import key_digest

    key = "pk_" + secrets.token_urlsafe(32)
    console.print(f"key:    {key}")
    console.print(f"digest: {key_digest(key)}")
    console.print("Give the key to the client; add the digest to PONDER_API_KEYS.")


def webhook_secret() -> None:
    """Print a fresh webhook signing secret (for PONDER_WEBHOOK_SECRET)."""
    from ponder.webhooks import generate_secret

    console.print(generate_secret(), highlight=False)
