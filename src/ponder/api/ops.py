"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ponder import metrics
from ponder.api.deps import State
from ponder.errors import RecoverableError

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """200 while the process lives."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    """200 when the store answers and at least one worker is alive, else 503."""
    store_ok = await state.store.ping()
    workers = 0
    if store_ok:
        try:
            workers = await state.store.live_workers()
        except RecoverableError:
            store_ok = False
    ready = store_ok and workers > 0
    body: dict[str, object] = {
        "status": "ready" if ready else "not_ready",
        "store": store_ok,
        "workers": workers,
    }
    if not ready:
        reason = "the store cannot be reached" if not store_ok else "no worker is alive"
        body["error"] = {"code": "unavailable", "message": reason}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def prometheus_metrics(state: State) -> Response:
    """Prometheus text format."""
    try:
        depths = await state.store.queue_depths()
        metrics.OUTBOX_DEPTH.set(await state.store.outbox_depth())
    except RecoverableError:
        depths = {}
    for priority, depth in depths.items():
        metrics.QUEUE_DEPTH.labels(priority=str(priority)).set(depth)
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
