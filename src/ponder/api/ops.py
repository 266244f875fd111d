"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ponder import metrics
from ponder.api.deps import State, engine_status
from ponder.config import NUM_PRIORITIES
from ponder.errors import RecoverableError

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """200 while the process lives."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, state: State) -> JSONResponse:
    """200 when the store answers, at least one worker is alive and this process's engine
    (where it runs one: ``ponder serve``) can run rows, else 503 with the reason."""
    status = engine_status(request)
    engine_down = status.engine_down() if status is not None else None
    store_ok = await state.store.ping()
    workers = 0
    if store_ok:
        try:
            workers = await state.store.live_workers()
        except RecoverableError:
            store_ok = False
    ready = store_ok and workers > 0 and engine_down is None
    body: dict[str, object] = {
        "status": "ready" if ready else "not_ready",
        "store": store_ok,
        "workers": workers,
    }
    if status is not None:
        body["engine"] = "live" if engine_down is None else "down"
    if not ready:
        if not store_ok:
            reason = "the store cannot be reached"
        elif engine_down is not None:
            reason = f"no engine is live: {engine_down}"
        else:
            reason = "no worker is alive"
        body["error"] = {"code": "unavailable", "message": reason}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def prometheus_metrics(state: State) -> Response:
    """Prometheus text format. The queue depth is per priority and model: every
    configured model's levels (0 where none is pending) and any other model with pending
    tasks."""
    try:
        by_model = await state.store.queue_depths_by_model()
        metrics.OUTBOX_DEPTH.set(await state.store.outbox_depth())
    except RecoverableError:
        by_model = None
    if by_model is not None:
        for model in [*state.settings.models, *by_model]:
            depths = by_model.get(model, {})
            for priority in range(NUM_PRIORITIES):
                metrics.QUEUE_DEPTH.labels(priority=str(priority), model=model).set(
                    depths.get(priority, 0)
                )
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
