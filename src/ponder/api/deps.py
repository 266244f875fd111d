"""Request-scoped dependencies: the app's state, the caller's identity and rate limit."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ponder.api.errors import ApiError
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.ratelimit import RateLimiter, create_rate_limiter, retry_after_s
from ponder.status import EngineStatus
from ponder.store.base import TaskStore

__all__ = [
    "AppState",
    "Caller",
    "CallerInfo",
    "caller_info",
    "check_rate",
    "engine_status",
    "get_owner",
    "get_state",
    "rate_limit",
]


@dataclass
class AppState:
    settings: Settings
    store: TaskStore
    ids: IdGenerator
    #: None when rate limits are off (``PONDER_RATE_LIMIT_PER_S=0``)
    limiter: RateLimiter | None = field(init=False)

    def __post_init__(self) -> None:
        self.limiter = create_rate_limiter(self.settings, self.store)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.ponder
    return state


def engine_status(request: Request) -> EngineStatus | None:
    """This process's engine, where it runs one (``ponder serve``); None in an API-only
    process."""
    status: EngineStatus | None = request.app.state.engine_status
    return status


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _unauthorized(message: str, error: str) -> ApiError:
    # RFC 6750: a 401 names the scheme; ``error`` is set when a key was sent
    challenge = f'Bearer error="{error}"' if error else "Bearer"
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": challenge})


def get_owner(request: Request) -> str:
    """The caller: the SHA-256 digest of its API key, or "" when auth is off.

    A missing or wrong key is 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``.
    """
    settings = get_state(request).settings
    if not settings.api_keys:
        return ""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("send `Authorization: Bearer <api key>`", "")
    digest = key_digest(key.strip())
    if not any(hmac.compare_digest(digest, known) for known in settings.api_keys):
        raise _unauthorized("the API key is not valid", "invalid_token")
    return digest


async def check_rate(state: AppState, owner: str, address: str | None) -> None:
    """Take a token from the caller's bucket: its key, or its address when auth is off.

    An empty bucket raises the 429 ``rate_limited`` answer with ``Retry-After`` (whole
    seconds). For routes that cannot use :func:`rate_limit` (WebSocket handlers).
    """
    limiter = state.limiter
    if limiter is None:
        return
    wait_s = await limiter.take(owner or f"addr:{address or 'unknown'}")
    if wait_s > 0:
        retry = retry_after_s(wait_s)
        raise ApiError(
            429,
            "rate_limited",
            f"over the rate limit of {limiter.rate:g} requests/s (burst {limiter.burst}); "
            f"retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )


async def _state(request: Request) -> AppState:
    return get_state(request)


async def _owner(request: Request) -> str:
    return get_owner(request)


# A route's parameters ``state: State`` and ``owner: Owner``. The dependencies are
# coroutines: FastAPI runs a plain function dependency in a worker thread, a hand-off
# that costs more than the function itself.
State = Annotated[AppState, Depends(_state)]
Owner = Annotated[str, Depends(_owner)]


async def rate_limit(request: Request, owner: Owner) -> None:
    """The per-caller rate limit as a dependency (``APIRouter(dependencies=[...])``)."""
    await check_rate(get_state(request), owner, request.client.host if request.client else None)


@dataclass(frozen=True, slots=True)
class CallerInfo:
    """Who calls (``owner``: :func:`get_owner`) and the app's state."""

    state: AppState
    owner: str


async def caller_info(request: Request) -> CallerInfo:
    """:data:`Caller`'s value. The polled route calls it itself: as a dependency, FastAPI's
    solving of it took another 15-25 µs a request (an in-process ASGI measurement)."""
    state = get_state(request)
    owner = get_owner(request)
    await check_rate(state, owner, request.client.host if request.client else None)
    return CallerInfo(state, owner)


# ``caller: Caller``: State, Owner and rate_limit as one dependency, for the routes every
# task passes through (/v1/tasks and its event stream): FastAPI's solving of each
# dependency costs more per request than the dependency's own work.
Caller = Annotated[CallerInfo, Depends(caller_info)]
