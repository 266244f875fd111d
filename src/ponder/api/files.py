"""OpenAI's Files API for the Batch API: ``/v1/files`` (upload, list, read, content, delete).

Uploads are ``multipart/form-data`` with ``file`` and ``purpose=batch`` (the only
purpose accepted): UTF-8 JSON Lines, at most ``PONDER_FILES_MAX_BYTES`` (413 above) and
``PONDER_BATCH_MAX_LINES`` requests; a line that is not a JSON object is refused (400
``invalid_file``) with its line number. The checks that need the batch's endpoint
(``custom_id``, ``url``, ``body``) run when a batch is created over the file. Output and
error files of batches have the purpose ``batch_output``. A key sees only its own files.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from ponder.api.deps import get_state
from ponder.api.openai_common import caller, openai_errors, query_int
from ponder.openai.batches import check_batch_file
from ponder.openai.common import OpenAIError, list_body
from ponder.openai.files import KIND, FileStore, file_id_of
from ponder.store.base import StoredObject

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["openai"])

_PURPOSES = ("batch",)


async def _load(request: Request, file_id: str) -> tuple[FileStore, StoredObject]:
    """The caller's file (404 otherwise)."""
    owner = await caller(request)
    state = get_state(request)
    files = FileStore(state.store, state.settings)
    obj = await files.get(file_id, owner)
    if obj is None:
        raise OpenAIError.not_found("file", file_id)
    return files, obj


@router.post("/files")
@openai_errors
async def create_file(request: Request) -> Response:
    """Upload a batch input file (see the module docstring)."""
    owner = await caller(request)
    state = get_state(request)
    settings = state.settings
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise OpenAIError(
            400, "bad_request", "send multipart/form-data with the fields file and purpose"
        )
    try:
        async with request.form(max_files=1, max_fields=8) as form:
            upload, purpose = form.get("file"), form.get("purpose")
            if purpose not in _PURPOSES:
                raise OpenAIError(
                    422, "invalid", "purpose: only batch files are accepted", param="purpose"
                )
            if not isinstance(upload, UploadFile):
                raise OpenAIError(422, "invalid", "file: send the file's content", param="file")
            data = await upload.read(settings.files_max_bytes + 1)
            filename = upload.filename or "upload.jsonl"
    except HTTPException as e:  # a malformed body, or one over the size limit
        code = "too_large" if e.status_code == 413 else "bad_request"
        raise OpenAIError(e.status_code, code, str(e.detail)) from e
    if len(data) > settings.files_max_bytes:
        raise OpenAIError(
            413,
            "too_large",
            f"file: over the limit of {settings.files_max_bytes} bytes (PONDER_FILES_MAX_BYTES)",
            param="file",
        )
    try:
        text = data.decode("utf-8")
        check_batch_file(text, settings.batch_max_lines)
    except UnicodeDecodeError as e:
        raise OpenAIError(400, "invalid_file", "file: not UTF-8 text", param="file") from e
    except ValueError as e:
        raise OpenAIError(400, "invalid_file", f"file: {e}", param="file") from e
    raw_id = state.ids.new_id()
    obj = await FileStore(state.store, settings).create(
        file_id=file_id_of(raw_id),
        raw_id=raw_id,
        owner=owner,
        filename=filename[:255],
        purpose=str(purpose),
        content=text,
    )
    return JSONResponse(obj.data)


@router.get("/files")
@openai_errors
async def list_files(request: Request) -> Response:
    """The caller's files, newest first: ``?after=<file id>&limit=`` (1..10000)."""
    owner = await caller(request)
    state = get_state(request)
    limit = query_int(request, "limit", 100, 1, 10_000)
    try:
        page, more = await state.store.list_objects(
            KIND, owner, after=request.query_params.get("after"), limit=limit
        )
    except ValueError as e:
        raise OpenAIError(422, "invalid", "after: not a file of this key", param="after") from e
    purpose = request.query_params.get("purpose")
    data = [o.data for o in page if purpose is None or o.data["purpose"] == purpose]
    return JSONResponse(list_body(data, more))


@router.get("/files/{file_id}")
@openai_errors
async def retrieve_file(file_id: str, request: Request) -> Response:
    """The file object."""
    _, obj = await _load(request, file_id)
    return JSONResponse(obj.data)


@router.get("/files/{file_id}/content")
@openai_errors
async def file_content(file_id: str, request: Request) -> Response:
    """The file's content (JSON Lines)."""
    files, obj = await _load(request, file_id)
    content = await files.content(obj.id)
    if content is None:
        raise OpenAIError.not_found("file content of", file_id)
    return Response(content.encode(), media_type="application/jsonl")


@router.delete("/files/{file_id}")
@openai_errors
async def delete_file(file_id: str, request: Request) -> Response:
    """Delete the file and its content."""
    files, obj = await _load(request, file_id)
    await files.delete(obj.id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
