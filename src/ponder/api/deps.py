"""Request-scoped dependencies: the app's state and the caller's identity."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request

from ponder.api.errors import ApiError
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.store.base import TaskStore

__all__ = ["AppState", "get_owner", "get_state"]


@dataclass
class AppState:
    settings: Settings
    store: TaskStore
    ids: IdGenerator


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.ponder
    return state


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def get_owner(request: Request) -> str:
    """The caller: the SHA-256 digest of its API key, or "" when auth is off."""
    settings = get_state(request).settings
    if not settings.api_keys:
        return ""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <api key>`")
    digest = key_digest(key.strip())
    if not any(hmac.compare_digest(digest, known) for known in settings.api_keys):
        raise ApiError(401, "unauthorized", "the API key is not valid")
    return digest
