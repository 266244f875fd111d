"""OpenAI's Batch API: ``/v1/batches`` (create, retrieve, list, cancel).

A batch runs the requests of an uploaded file (``/v1/files``, ``purpose=batch``) against
``/v1/chat/completions`` or ``/v1/responses``, each line as a ponder task at
``PONDER_BATCH_PRIORITY``; the batch feeder (:mod:`ponder.openai.batch_feeder`, beside
the workers) moves it through ``validating → in_progress → finalizing → completed`` (or
``failed``, ``expired``, ``cancelling → cancelled``) and writes the output and error
files. ``completion_window`` is OpenAI's ``24h``, or any shorter ``<n>s|m|h`` (ponder).
The extra body field ``webhook_url`` (or ``PONDER_WEBHOOK_URL``) gets the batch's
``batch.*`` webhook. A key sees only its own batches. The request body and the batch
objects are :mod:`ponder.openai.batches`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ponder.api.deps import get_state
from ponder.api.openai_common import caller, openai_errors, query_int, read_json
from ponder.ids import sort_key
from ponder.openai.batches import (
    KIND,
    BatchStatus,
    batch_request,
    cancel_lines,
    new_batch,
    public_batch,
)
from ponder.openai.common import OpenAIError, check_webhook_url, list_body
from ponder.openai.files import FileStore
from ponder.store.base import StoredObject

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["openai"])

_CAS_RETRIES = 10
_CANCELLABLE = (BatchStatus.validating, BatchStatus.in_progress)


async def _load(request: Request, batch_id: str) -> StoredObject:
    """The caller's batch (404 otherwise)."""
    owner = await caller(request)
    obj = await get_state(request).store.get_object(KIND, batch_id)
    if obj is None or obj.owner != owner:
        raise OpenAIError.not_found("batch", batch_id)
    return obj


@router.post("/batches")
@openai_errors
async def create_batch(request: Request) -> Response:
    """Create a batch over an uploaded input file; it starts ``validating``."""
    owner = await caller(request)
    state = get_state(request)
    req = batch_request(await read_json(request))
    source = await FileStore(state.store, state.settings).get(req.input_file_id, owner)
    if source is None:
        raise OpenAIError.not_found("file", req.input_file_id)
    if source.data["purpose"] != "batch":
        raise OpenAIError(
            422, "invalid", "input_file_id: not a file of purpose batch", param="input_file_id"
        )
    if req.webhook_url is not None:
        await check_webhook_url(req.webhook_url, state.settings, "webhook_url")
    raw_id = state.ids.new_id()
    data = new_batch(
        f"batch_{raw_id}",
        input_file_id=req.input_file_id,
        endpoint=req.endpoint,
        window=req.completion_window,
        metadata=req.metadata,
        webhook_url=req.webhook_url or state.settings.webhook_url,
    )
    obj = StoredObject(KIND, f"batch_{raw_id}", owner, sort_key(raw_id), data, active=True)
    # kept until its output files expire
    await state.store.create_object(obj, ttl_s=state.settings.files_ttl_s)
    return JSONResponse(public_batch(obj))


@router.get("/batches/{batch_id}")
@openai_errors
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    """The batch object: status, ``request_counts``, the output and error file ids."""
    return JSONResponse(public_batch(await _load(request, batch_id)))


@router.get("/batches")
@openai_errors
async def list_batches(request: Request) -> Response:
    """The caller's batches, newest first: ``?after=<batch id>&limit=`` (1..100)."""
    owner = await caller(request)
    limit = query_int(request, "limit", 20, 1, 100)
    try:
        page, more = await get_state(request).store.list_objects(
            KIND, owner, after=request.query_params.get("after"), limit=limit
        )
    except ValueError as e:
        raise OpenAIError(422, "invalid", "after: not a batch of this key", param="after") from e
    return JSONResponse(list_body([public_batch(o) for o in page], more))


@router.post("/batches/{batch_id}/cancel")
@openai_errors
async def cancel_batch(batch_id: str, request: Request) -> Response:
    """Cancel a batch: ``cancelling`` and its queued lines cancelled at once (none starts
    after the answer); the feeder lets the running ones finish and ends it ``cancelled``
    with the finished lines kept."""
    store = get_state(request).store
    for _ in range(_CAS_RETRIES):
        obj = await _load(request, batch_id)
        batch: dict[str, Any] = obj.data["batch"]
        if batch["status"] in (BatchStatus.cancelling, BatchStatus.cancelled):
            return JSONResponse(batch)
        if batch["status"] not in _CANCELLABLE:
            status = batch["status"]
            raise OpenAIError(409, "conflict", f"the batch is {status}; it cannot be cancelled")
        batch.update(status=BatchStatus.cancelling, cancelling_at=int(time.time()))
        if await store.update_object(obj):
            lines = list(obj.data.get("state", {}).get("in_flight", {}).values())
            await cancel_lines(store, await store.get_tasks(lines), obj.owner, running=False)
            return JSONResponse(batch)
    raise OpenAIError(503, "unavailable", "the batch kept changing while cancelling; retry")
