"""An ASGI middleware that refuses request bodies over the configured size with 413."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ponder.api.errors import error_response

__all__ = ["BodySizeLimit"]


class BodySizeLimit:
    """Reject bodies over ``max_bytes`` (``path_limits``: other limits for some paths, e.g.
    file uploads): by Content-Length up front, else while reading (raising the 413 that
    the API's error handlers turn into the envelope)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    @staticmethod
    def _message(limit: int) -> str:
        return f"the request body is over the limit of {limit} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_bytes)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = error_response(413, "too_large", self._message(limit))
                await response(scope, receive, send)
                return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, self._message(limit))
            return message

        await self.app(scope, limited_receive, send)
