"""The error envelope of API.md on every non-2xx answer (:class:`ApiError` and the
refusals of :mod:`ponder.admission`: :class:`~ponder.errors.Refusal`); no stack trace
reaches a client."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ponder.errors import Refusal, StoreUnavailable
from ponder.schemas import describe_errors

__all__ = ["ApiError", "error_response", "install_error_handlers"]

log = logging.getLogger("ponder.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "rate_limited",
    503: "unavailable",
}


class ApiError(Refusal):
    """An answer of a route with the error envelope (``extra`` adds fields beside it)."""

    @classmethod
    def of(cls, e: Refusal) -> ApiError:
        """The same answer as ``e`` (a refusal of :mod:`ponder.admission`) as an ApiError."""
        return cls(e.status, e.code, e.message, headers=e.headers, extra=e.extra)


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}, **extra}, status_code=status, headers=headers
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Refusal)  # an ApiError, or a refusal of ponder.admission
    async def _refused(_: Request, exc: Refusal) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "bad_request", "the body is not valid JSON")
        return error_response(422, "invalid", describe_errors(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "bad_request" if exc.status_code < 500 else "internal")
        return error_response(exc.status_code, code, str(exc.detail), exc.headers)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        log.warning("store unavailable: %s", exc)
        return error_response(
            503,
            "unavailable",
            "the task store cannot be reached; retry later",
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "internal", "internal error; the server log has the details")
