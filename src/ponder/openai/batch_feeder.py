"""The batch feeder: runs a batch's lines as tasks and writes its output and error files.

Batches are store objects (:mod:`ponder.openai.batches`). Every change is a compare-and-set
write, so the API's cancel and the feeder never overwrite each other, and a batch
survives a restart of every process: a new feeder carries on from the stored state.

:class:`BatchFeeder` runs beside the workers (``WorkerRuntime``): it moves batches
forward as the workers move tasks forward, and it needs no engine. One feeder at a time
holds the store lease ``batch-feeder`` (renewed every tick; another process takes over
within ``PONDER_LEASE_S`` of a crash), so no two processes feed one batch. Each tick
(``PONDER_BATCH_TICK_S``) it

1. validates new batches (``validating`` → ``in_progress``, or ``failed`` with the
   errors and their line numbers);
2. collects the lines whose task ended (one bulk read): each becomes a line of the
   output file (2xx) or of the error file, in OpenAI's format, kept as a part in the
   store at once;
3. admits more lines while fewer than ``PONDER_BATCH_MAX_IN_FLIGHT`` are in flight and
   the other pending tasks are below ``PONDER_BATCH_INTERACTIVE_SHARE`` of
   ``PONDER_MAX_PENDING``. A line is a task at ``PONDER_BATCH_PRIORITY`` on the store's
   batch lane, which has a backlog of its own, so batch lines never make an interactive
   submit see ``queue_full``; its idempotency key (``batch:<id>:<n>``) makes a line
   admitted twice (after a crash) one task;
4. ends batches: ``completed`` (through ``finalizing``), ``cancelled`` (after
   ``cancelling``: queued lines are cancelled, running ones finish) or ``expired`` (the
   ``completion_window`` passed: its lines in flight are cancelled). Finished lines are
   always kept; lines that never ran are in the error file as ``batch_cancelled`` /
   ``batch_expired``; a line whose task expired in the queue (not started within its
   ``queue_timeout_s``) is in the error file as ``queue_timeout``, counted as failed;
5. queues the webhooks of ended background responses and batches in the store's outbox
   (:func:`~ponder.openai.webhooks.enqueue_event`; every worker process's delivery loop
   sends them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ponder.config import Settings
from ponder.errors import RecoverableError
from ponder.ids import IdGenerator
from ponder.openai.batches import (
    KIND,
    NOT_RUN,
    BatchLine,
    BatchStatus,
    cancel_lines,
    error_line,
    output_line,
    read_lines,
    usage_object,
)
from ponder.openai.chat import chat_body, completion_body
from ponder.openai.common import OpenAIError, failure, openai_usage, submit
from ponder.openai.files import FileStore, file_id_of
from ponder.openai.responses import KIND as RESPONSE_KIND
from ponder.openai.responses import QUEUE_TIMEOUT, parse_response_body, response_object
from ponder.openai.webhooks import BATCH_EVENTS, RESPONSE_EVENTS, enqueue_event
from ponder.schemas import TaskCreate
from ponder.states import is_terminal
from ponder.store.base import Liveness, ObjectStore, Outbox, StoredObject, TaskRecords
from ponder.types import Task, TaskStatus

__all__ = ["LEASE", "BatchFeeder", "FeederStore"]

log = logging.getLogger("ponder.batches")

LEASE = "batch-feeder"
_MAX_ERRORS = 100  # validation errors listed on a failed batch
_SWEEP_EVERY_S = 3600.0

#: how a line's task is answered: (HTTP status, body) as its endpoint would
_Render = Callable[[Task], tuple[int, Any]]


class FeederStore(TaskRecords, ObjectStore, Outbox, Liveness, Protocol):
    """The parts of the store the feeder uses: the lines' tasks, the batches and their
    parts, the webhook outbox and its lease."""


@dataclass
class _Sink:
    """Where the feeder submits lines (a :class:`~ponder.admission.TaskSink`)."""

    settings: Settings
    store: TaskRecords
    ids: IdGenerator


class BatchFeeder:
    """Feeds batches, ends them, and queues the OpenAI-shaped webhooks (module docstring).

    The owner runs :meth:`run` as a task and calls :meth:`stop`; ``run`` returns after
    the current tick and gives the lease up.
    """

    def __init__(self, store: FeederStore, settings: Settings, *, holder: str) -> None:
        self.store = store
        self.settings = settings
        self.holder = holder
        self.files = FileStore(store, settings)
        # a node of its own: ids made here never collide with the API's in this process
        self._sink = _Sink(settings, store, IdGenerator(f"{settings.node_id}.batch"))
        self._lines: dict[str, list[BatchLine]] = {}  # input lines of the batches being fed
        self._stopping = asyncio.Event()
        self._swept_at = 0.0

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        backoff_s = self.settings.batch_tick_s
        try:
            while not self._stopping.is_set():
                delay_s = self.settings.batch_tick_s
                try:
                    await self.tick()
                    backoff_s = delay_s
                except RecoverableError as e:
                    log.warning("batch feeder: %s; retrying in %.1fs", e, backoff_s)
                    delay_s, backoff_s = backoff_s, min(backoff_s * 2, 5.0)
                except Exception:  # a bug must not stop the feeding of every batch
                    log.exception("batch feeder: unexpected error; retrying in %.1fs", backoff_s)
                    delay_s, backoff_s = backoff_s, min(backoff_s * 2, 5.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay_s)
        finally:
            with contextlib.suppress(RecoverableError):
                await self.store.release_lease(LEASE, self.holder)

    async def tick(self) -> None:
        """One round of the control loop (a no-op unless this feeder holds the lease)."""
        if not await self.store.acquire_lease(LEASE, self.holder, self.settings.lease_s):
            self._lines.clear()  # another feeder is at work; its progress is in the store
            return
        await self._feed()
        await self._watch_responses()
        if time.monotonic() - self._swept_at > _SWEEP_EVERY_S:
            self._swept_at = time.monotonic()
            await self.files.sweep()

    # --- batches ----------------------------------------------------------------------
    async def _feed(self) -> None:
        ids = await self.store.active_objects(KIND)
        self._lines = {k: v for k, v in self._lines.items() if k in ids}
        batches: list[tuple[StoredObject, str]] = []  # each with its data as read
        for batch_id in ids:
            obj = await self.store.get_object(KIND, batch_id)
            if obj is None or not obj.active:
                continue
            if obj.data["state"].get("ended"):
                await self._retire(obj)  # a restart came between its end and its webhook
                continue
            read = json.dumps(obj.data)
            await self._harvest(obj)
            batches.append((obj, read))
        room = self.settings.batch_max_in_flight - sum(
            len(obj.data["state"]["in_flight"]) for obj, _ in batches
        )
        if batches and room > 0 and await self._interactive_below_share():
            for obj, _ in batches:
                room -= await self._admit(obj, room)
        for obj, read in batches:
            await self._settle(obj, changed=json.dumps(obj.data) != read)

    async def _interactive_below_share(self) -> bool:
        other = await self.store.pending_count() - await self.store.batch_pending_count()
        return other < self.settings.batch_interactive_share * self.settings.max_pending

    async def _harvest(self, obj: StoredObject) -> None:
        """Validate a new batch; record the lines whose task ended; start the end of a
        cancelled or expired batch."""
        batch, state = obj.data["batch"], obj.data["state"]
        if batch["status"] == BatchStatus.validating:
            await self._validate(obj)
            return
        if batch["status"] not in (BatchStatus.in_progress, BatchStatus.cancelling):
            return
        lines = await self._input(obj)
        if lines is None:
            return
        in_flight: dict[str, str] = state["in_flight"]
        tasks = await self.store.get_tasks(list(in_flight.values()))
        for (n, _), task in zip(list(in_flight.items()), tasks, strict=True):
            if task is None or is_terminal(task.status):
                await self._record(obj, lines[int(n)], int(n), task)
                del in_flight[n]
        ending = self._ending(obj)
        overdue = batch["status"] == BatchStatus.in_progress and time.time() >= batch["expires_at"]
        if ending is None and overdue:
            state["ending"] = ending = BatchStatus.expired
        if ending is not None:
            # queued lines are cancelled (the cancel route did too); running ones on expiry
            running = ending == BatchStatus.expired
            await cancel_lines(self.store, tasks, obj.owner, running=running)

    @staticmethod
    def _ending(obj: StoredObject) -> BatchStatus | None:
        """How the batch is ending (cancelled, expired), or None while it runs on."""
        if obj.data["batch"]["status"] == BatchStatus.cancelling:
            return BatchStatus.cancelled
        ending: str | None = obj.data["state"]["ending"]
        return None if ending is None else BatchStatus(ending)

    async def _validate(self, obj: StoredObject) -> None:
        batch = obj.data["batch"]
        text = await self.files.content(batch["input_file_id"])
        if text is None:
            error = {
                "code": "file_not_found",
                "line": None,
                "param": "input_file_id",
                "message": f"the input file {batch['input_file_id']} is gone",
            }
            await self._fail(obj, [error])
            return
        lines, errors = read_lines(text, batch["endpoint"])
        if errors:
            await self._fail(obj, errors)
            return
        batch.update(status=BatchStatus.in_progress, in_progress_at=int(time.time()))
        batch["request_counts"]["total"] = len(lines)
        if await self.store.update_object(obj):
            self._lines[obj.id] = lines
            log.info("batch %s: %d requests, in progress", obj.id, len(lines))

    async def _fail(self, obj: StoredObject, errors: list[dict[str, Any]]) -> None:
        batch = obj.data["batch"]
        batch.update(
            status=BatchStatus.failed,
            failed_at=int(time.time()),
            errors={"object": "list", "data": errors[:_MAX_ERRORS]},
        )
        await self._end(obj, BatchStatus.failed)

    async def _input(self, obj: StoredObject) -> list[BatchLine] | None:
        """The batch's requests (read again after a restart); None (the batch failed)
        when its input file is gone."""
        lines = self._lines.get(obj.id)
        if lines is None:
            text = await self.files.content(obj.data["batch"]["input_file_id"])
            if text is None:
                error = {
                    "code": "file_not_found",
                    "line": None,
                    "param": "input_file_id",
                    "message": "the input file was deleted while the batch ran",
                }
                await self._fail(obj, [error])
                return None
            lines, _ = read_lines(text, obj.data["batch"]["endpoint"])
            self._lines[obj.id] = lines
        return lines

    def _line_task(self, obj: StoredObject, line: BatchLine) -> tuple[TaskCreate, _Render]:
        """The task of a line and how to answer it: ``render(task)`` → (status, body), what
        the endpoint would have answered."""
        answer: Callable[[Task], dict[str, Any]]
        if obj.data["batch"]["endpoint"] == "/v1/chat/completions":
            chat, task_req = chat_body(line.body, self.settings, "body.")
            answer = functools.partial(completion_body, req=chat)
        else:
            body = {**line.body, "background": False, "stream": False, "store": False}
            _, meta, task_req = parse_response_body(body, self.settings, "batch", "body.")
            answer = functools.partial(response_object, meta)

        def render(task: Task) -> tuple[int, Any]:
            error = failure(task, task.id)
            return (200, answer(task)) if error is None else (error.status, error.body())

        task_req.metadata = {"batch_id": obj.id, "custom_id": line.custom_id}
        return task_req, render

    async def _admit(self, obj: StoredObject, room: int) -> int:
        """Submit up to ``room`` more lines; how many went in flight."""
        batch, state = obj.data["batch"], obj.data["state"]
        lines = self._lines.get(obj.id)
        if batch["status"] != BatchStatus.in_progress or state["ending"] or lines is None:
            return 0
        used = 0
        while used < room and state["next_line"] < len(lines):
            n = state["next_line"]
            try:
                task_req, _ = self._line_task(obj, lines[n])
                task, _ = await submit(
                    self._sink, task_req, obj.owner, f"batch:{obj.id}:{n}", batch=True
                )
            except OpenAIError as e:
                if e.code == "queue_full":
                    break  # the batch lane is full: wait for lines to start
                e.message = f"line {lines[n].number}: {e.message}"
                request_id = f"{obj.id.removeprefix('batch_')}-{n}"
                await self._keep(
                    obj,
                    n,
                    output_line(lines[n].custom_id, request_id, e.status, e.body()),
                    ok=False,
                )
            else:
                state["in_flight"][str(n)] = task.id
                used += 1
            state["next_line"] = n + 1
        return used

    async def _record(self, obj: StoredObject, line: BatchLine, n: int, task: Task | None) -> None:
        """Keep the outcome of a line whose task ended (or expired)."""
        ending = self._ending(obj)
        if task is None:
            entry = error_line(
                line.custom_id,
                f"{obj.id}-{n}",
                "task_expired",
                "the request's task expired before its result was collected",
            )
            await self._keep(obj, n, entry, ok=False)
            return
        if task.status == TaskStatus.cancelled and ending in NOT_RUN:
            entry = error_line(line.custom_id, task.id, f"batch_{ending}", NOT_RUN[ending])
            await self._keep(obj, n, entry, ok=None)
            return
        if task.status == TaskStatus.expired:  # never ran: an error, counted as failed
            message = task.error.message if task.error else "not started within its deadline"
            await self._keep(
                obj, n, error_line(line.custom_id, task.id, QUEUE_TIMEOUT, message), ok=False
            )
            return
        try:
            _, render = self._line_task(obj, line)
        except OpenAIError as e:  # the settings changed since it was admitted
            status, body = e.status, e.body()
        else:
            status, body = render(task)
        ok = 200 <= status < 300
        usage = openai_usage(task)
        await self._keep(
            obj, n, output_line(line.custom_id, task.id, status, body), ok=ok, usage=usage
        )

    async def _keep(
        self,
        obj: StoredObject,
        n: int,
        entry: dict[str, Any],
        *,
        ok: bool | None,
        usage: tuple[int, int] = (0, 0),
    ) -> None:
        """Store line ``n``'s entry of the output (``ok``) or error file, and count it
        (``ok=None``: a line that never ran, counted as neither)."""
        part = {"ok": bool(ok), "entry": entry}
        await self.store.put_part(obj.id, n, json.dumps(part), ttl_s=self.settings.files_ttl_s)
        batch = obj.data["batch"]
        if ok is not None:
            batch["request_counts"]["completed" if ok else "failed"] += 1
        total = batch["usage"]
        batch["usage"] = usage_object(
            total["input_tokens"] + usage[0], total["output_tokens"] + usage[1]
        )

    async def _settle(self, obj: StoredObject, *, changed: bool) -> None:
        """End the batch when nothing is left to run; write its progress if it changed."""
        batch, state = obj.data["batch"], obj.data["state"]
        if state.get("ended"):
            return  # it failed this tick
        lines = self._lines.get(obj.id)
        done = lines is not None and state["next_line"] >= len(lines)
        if batch["status"] == BatchStatus.finalizing or (
            batch["status"] in (BatchStatus.in_progress, BatchStatus.cancelling)
            and not state["in_flight"]
            and (done or self._ending(obj) is not None)
        ):
            await self._finalize(obj)
        elif changed and not await self.store.update_object(obj):
            log.info("batch %s changed meanwhile (a cancel?); carrying on next tick", obj.id)

    async def _finalize(self, obj: StoredObject) -> None:
        """Write the output and error files and the final status."""
        batch = obj.data["batch"]
        ending = self._ending(obj) or BatchStatus.completed
        now = int(time.time())
        if ending == BatchStatus.completed and batch["status"] != BatchStatus.finalizing:
            batch.update(status=BatchStatus.finalizing, finalizing_at=now)
            if not await self.store.update_object(obj):
                return  # cancelled meanwhile: it ends as cancelled
        lines = await self._input(obj)
        if lines is None:
            return  # its input file is gone: it failed
        parts = await self.store.get_parts(obj.id)
        files: dict[bool, list[str]] = {True: [], False: []}
        for n, line in enumerate(lines):
            part = json.loads(parts[n]) if n in parts else None
            if part is None:
                entry = error_line(
                    line.custom_id,
                    f"{obj.id}-{n}",
                    f"batch_{ending}",
                    NOT_RUN.get(ending, "not run"),
                )
                part = {"ok": False, "entry": entry}
            files[part["ok"]].append(json.dumps(part["entry"], separators=(",", ":")))
        raw = obj.id.removeprefix("batch_")
        outputs = ((True, "output_file_id", "-output"), (False, "error_file_id", "-errors"))
        for ok, field, suffix in outputs:
            if files[ok]:
                file_id = file_id_of(raw, suffix)
                await self.files.create(
                    file_id=file_id,
                    raw_id=raw,
                    owner=obj.owner,
                    filename=f"{obj.id}{suffix}.jsonl",
                    purpose="batch_output",
                    content="\n".join(files[ok]) + "\n",
                )
                batch[field] = file_id
        batch.update(status=ending, **{f"{ending}_at": now})
        await self._end(obj, ending)

    async def _end(self, obj: StoredObject, ending: BatchStatus) -> None:
        """Write the final status; the batch stays active until its webhook is queued."""
        obj.data["state"]["ended"] = ending
        if await self.store.update_object(obj):
            await self._retire(obj)

    async def _retire(self, obj: StoredObject) -> None:
        """Queue an ended batch's webhook, then make it inactive and drop its parts."""
        ending = obj.data["state"]["ended"]
        url = obj.data["state"]["webhook_url"]
        if url is not None:
            await enqueue_event(
                self.store,
                url=url,
                event_type=BATCH_EVENTS[ending],
                object_id=obj.id,
            )
        obj.active = False
        if await self.store.update_object(obj):
            await self.store.delete_parts(obj.id)
            self._lines.pop(obj.id, None)
            log.info("batch %s %s: %s", obj.id, ending, obj.data["batch"]["request_counts"])

    # --- background responses ---------------------------------------------------------
    async def _watch_responses(self) -> None:
        """Send the webhook of each background response whose task ended."""
        ids = await self.store.active_objects(RESPONSE_KIND)
        tasks = await self.store.get_tasks([i.removeprefix("resp_") for i in ids])
        for response_id, task in zip(ids, tasks, strict=True):
            if task is not None and not is_terminal(task.status):
                continue
            obj = await self.store.get_object(RESPONSE_KIND, response_id)
            if obj is None:
                continue
            if task is not None and obj.data.get("webhook_url"):
                await enqueue_event(
                    self.store,
                    url=obj.data["webhook_url"],
                    event_type=RESPONSE_EVENTS[task.status],
                    object_id=response_id,
                )
            obj.active = False
            await self.store.update_object(obj)
