"""The dynamic batcher in front of every engine: many ``submit`` calls, few engine calls.

Each request holds its own future. One dispatch loop (started by :meth:`start`, owned and
awaited by :meth:`close`) turns the buffer into batches; it sleeps on an event that is set
by every arrival, cancellation and finished batch, with a timeout that ends at the next
timed trigger (the oldest request's deadline, or the adaptive dispatch time) — never a
fixed-interval poll.

A batch is dispatched when a batch slot is free (``max_concurrent_batches``) and

1. the oldest buffered request has waited ``max_wait_ms`` since its arrival: a mixed
   batch is allowed. With a backlog (more than ``2 * max_batch_size`` buffered: the engine
   is the bottleneck, so padding costs throughput) it is drawn from the oldest request's
   length bucket and topped up from the nearest other buckets; without one it takes the
   oldest requests of any length (at most two batches' worth wait: reordering them would
   add latency for little padding saved); or
2. a length bucket holds ``max_batch_size`` requests: a full batch from that bucket alone;
   or
3. (``adaptive``) the engine is idle (has a free batch slot: with the default one batch
   at a time, runs nothing) and, at the recent arrival rate, a full batch is not
   expected before the oldest request's deadline: the batch is dispatched at once, as it
   would be at the deadline, rather than idling the engine.

When more requests wait in the chosen bucket(s) than fit, the batch is filled by weighted
fair share across priority levels (:class:`~ponder.scheduling.WeightedFairPicker`), oldest
first inside a level.

Completion tokens are counted by the worker (``TOKENS_GENERATED``), not here; the batcher
records the batch metrics and ``ENGINE_TOKENS_PER_S``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ponder import metrics
from ponder.config import NUM_PRIORITIES
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.errors import BatcherFull, EngineDeadError, EngineError
from ponder.scheduling import WeightedFairPicker

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = ["BatcherClosed", "DynamicBatcher"]

log = logging.getLogger("ponder.batcher")

#: a deadline this close (seconds) counts as reached: timers may fire a hair early
_DEADLINE_SLACK_S = 1e-6
#: the arrival-rate estimate looks back this far at least (seconds)
_MIN_RATE_HORIZON_S = 1.0
#: more than this many full batches buffered is a backlog: pack batches by length
_BACKLOG_BATCHES = 2

_State = Literal["buffered", "running", "done"]


class BatcherClosed(EngineError):
    """The batcher was closed (or its dispatch loop failed) before the request ran."""


@dataclass(eq=False, slots=True)
class _Entry:
    """One buffered request and the future its ``submit`` call awaits."""

    request: SampleRequest
    future: asyncio.Future[SampleOutput]
    seq: int
    arrival: float
    deadline: float
    priority: int
    bucket: int
    length: int
    state: _State = field(default="buffered")


def _cancelled_output() -> SampleOutput:
    return SampleOutput(text="", finish_reason="cancelled")


class DynamicBatcher:
    """Collects :class:`SampleRequest` s into engine batches; see the module docstring.

    Contract of the public methods:

    - :meth:`start` starts the dispatch loop (not ``__init__``); :meth:`close` stops it.
    - :meth:`submit` returns the request's :class:`SampleOutput` or raises:
      :class:`~ponder.errors.BatcherFull` at once when ``max_buffer`` requests are
      buffered (back off and retry); :class:`~ponder.errors.EngineError` when the
      request's row failed (a batch the engine failed as a whole is bisected, so only a
      poisonous row fails); :class:`BatcherClosed` (an ``EngineError``) when the batcher
      is or gets closed before the row ran; :class:`~ponder.errors.EngineDeadError` when
      the engine says it can serve no more. If the awaiting coroutine is cancelled, a
      buffered request is removed from the buffer (it never reaches the engine) and a
      running one gets ``request.cancel()`` and its output dropped; the CancelledError
      propagates. A request whose ``cancelled`` flag is set while buffered (or before
      ``submit``) never reaches the engine and returns ``finish_reason="cancelled"``.
      ValueError for a priority outside 0..5; RuntimeError before :meth:`start`.
    - :meth:`depth` is the number of buffered (not yet dispatched) requests.

    ``clock`` must tick in seconds (timeouts are real ``asyncio`` waits of the clock's
    differences); tests pass a fake clock to control deadlines.
    """

    def __init__(
        self,
        engine: BaseEngine,
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 50.0,
        max_buffer: int = 1000,
        max_concurrent_batches: int = 1,
        bucket_edges: Sequence[int] = (64, 256, 1024),
        priority_quotas: Sequence[int] = (4, 3, 2, 2, 1, 1),
        adaptive: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        edges, quotas = _check_arguments(
            max_batch_size,
            max_wait_ms,
            max_buffer,
            max_concurrent_batches,
            bucket_edges,
            priority_quotas,
            clock,
        )

        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.max_buffer = max_buffer
        self.max_concurrent_batches = max_concurrent_batches
        self.bucket_edges: tuple[int, ...] = tuple(edges)
        self.adaptive = adaptive
        self._picker = WeightedFairPicker(quotas)  # checks each quota
        self._clock = clock
        self._max_wait_s = self.max_wait_ms / 1000
        self._rate_horizon_s = max(_MIN_RATE_HORIZON_S, 20 * self._max_wait_s)

        n_buckets = len(edges) + 1
        #: every buffered entry, in arrival order (dicts keep insertion order)
        self._buffer: dict[_Entry, None] = {}
        #: the same entries by [bucket][priority], each in arrival order
        self._buckets: list[list[dict[_Entry, None]]] = [
            [{} for _ in range(NUM_PRIORITIES)] for _ in range(n_buckets)
        ]
        self._bucket_sizes = [0] * n_buckets
        self._arrivals: deque[float] = deque(maxlen=4 * max_batch_size)
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: BaseException | None = None

    @classmethod
    def from_settings(cls, engine: BaseEngine, settings: Settings) -> DynamicBatcher:
        """A batcher configured by the ``batch_*`` settings and ``priority_quotas``."""
        return cls(
            engine,
            max_batch_size=settings.batch_max_size,
            max_wait_ms=settings.batch_max_wait_ms,
            max_buffer=settings.batch_max_buffer,
            max_concurrent_batches=settings.batch_max_concurrent,
            bucket_edges=settings.batch_bucket_edges,
            priority_quotas=settings.priority_quotas,
            adaptive=settings.batch_adaptive,
        )

    # --- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Start the dispatch loop (idempotent). RuntimeError once closed."""
        if self._closed:
            raise RuntimeError("this batcher is closed; create a new one")
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._dispatch_loop(), name="ponder-batcher")

    async def close(self) -> None:
        """Stop intake, fail buffered requests, await the loop and the running batches.

        Buffered requests fail with :class:`BatcherClosed`; running batches finish
        normally. If ``close`` itself is cancelled while it waits for them, they are
        cancelled (their requests fail with BatcherClosed) and the CancelledError
        propagates. Idempotent.
        """
        if not self._closed:
            self._closed = True
            self._fail_buffered("the batcher closed before this request was dispatched")
        self._wakeup.set()
        if self._loop_task is not None:
            await self._loop_task
        running = set(self._running)
        if not running:
            return
        try:
            await asyncio.wait(running)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            await asyncio.wait(running)
            raise

    # --- intake -----------------------------------------------------------------------
    def depth(self) -> int:
        """Requests buffered (waiting for a batch; running ones are not counted)."""
        return len(self._buffer)

    async def submit(self, request: SampleRequest) -> SampleOutput:
        """Run ``request`` in some batch and return its output; see the class contract."""
        if self._closed:
            reason = f": its dispatch loop failed ({self._failure!r})" if self._failure else ""
            raise BatcherClosed(f"the batcher is closed{reason}")
        if self._loop_task is None:
            raise RuntimeError("call DynamicBatcher.start() before submit()")
        priority = request.priority
        if not 0 <= priority < NUM_PRIORITIES:
            raise ValueError(f"priority must be 0..{NUM_PRIORITIES - 1}, got {priority}")
        if request.is_cancelled:
            return _cancelled_output()
        if len(self._buffer) >= self.max_buffer:
            raise BatcherFull(
                f"the batcher's buffer is full ({len(self._buffer)} requests waiting, "
                f"max_buffer={self.max_buffer}); back off and retry"
            )
        length = self.engine.prompt_length(request)
        now = self._clock()
        loop = asyncio.get_running_loop()
        entry = _Entry(
            request=request,
            future=loop.create_future(),
            seq=next(self._seq),
            arrival=now,
            deadline=now + self._max_wait_s,
            priority=priority,
            bucket=bisect.bisect_left(self.bucket_edges, length),
            length=length,
        )
        self._add(entry)
        self._arrivals.append(now)
        self._wakeup.set()
        request.on_cancel(lambda: self._on_request_cancel(loop, entry))
        try:
            return await entry.future
        except asyncio.CancelledError:
            if entry.state == "buffered":
                self._remove(entry)
                entry.state = "done"
                self._wakeup.set()
            elif entry.state == "running":
                request.cancel()  # the engine may stop early; the output is dropped
            raise

    def _on_request_cancel(self, loop: asyncio.AbstractEventLoop, entry: _Entry) -> None:
        """``request.cancel()`` may come from any thread: act on it in the loop's thread."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._drop_cancelled(entry)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
            loop.call_soon_threadsafe(self._drop_cancelled, entry)

    def _drop_cancelled(self, entry: _Entry) -> None:
        if entry.state == "buffered":
            self._remove(entry)
            entry.state = "done"
            if not entry.future.done():
                entry.future.set_result(_cancelled_output())
            self._wakeup.set()

    # --- the buffer -------------------------------------------------------------------
    def _add(self, entry: _Entry) -> None:
        self._buffer[entry] = None
        self._buckets[entry.bucket][entry.priority][entry] = None
        self._bucket_sizes[entry.bucket] += 1
        metrics.BUFFER_DEPTH.labels(priority=str(entry.priority)).inc()

    def _remove(self, entry: _Entry) -> None:
        del self._buffer[entry]
        del self._buckets[entry.bucket][entry.priority][entry]
        self._bucket_sizes[entry.bucket] -= 1
        metrics.BUFFER_DEPTH.labels(priority=str(entry.priority)).dec()

    def _fail_buffered(self, message: str) -> None:
        for entry in list(self._buffer):
            self._remove(entry)
            entry.state = "done"
            if not entry.future.done():
                entry.future.set_exception(BatcherClosed(message))

    # --- the dispatch loop ------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        """Dispatch due batches, then sleep until an event or the next timed trigger."""
        try:
            while not self._closed:
                self._wakeup.clear()
                timeout_s = self._dispatch_due()
                if self._closed:
                    break
                if timeout_s is None:
                    await self._wakeup.wait()
                    continue
                try:
                    async with asyncio.timeout(timeout_s):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
        except Exception as e:
            # A bug, not an engine failure: pass it to every waiter instead of hanging them.
            log.exception("the batcher's dispatch loop failed")
            self._failure = e
            self._closed = True
            self._fail_buffered(f"the batcher's dispatch loop failed: {e!r}")

    def _dispatch_due(self) -> float | None:
        """Dispatch every batch that is due now.

        Returns the seconds until the next timed trigger, or None when only an event
        (an arrival, a finished batch, a close) can make a batch due.
        """
        while self._buffer and len(self._running) < self.max_concurrent_batches:
            now = self._clock()
            oldest = next(iter(self._buffer))
            full = self._full_bucket()
            if oldest.deadline <= now + _DEADLINE_SLACK_S:
                batch = self._compose(oldest.bucket, mixed=True)
            elif full is not None:
                batch = self._compose(full, mixed=False)
            elif self.adaptive:  # a slot is free: the engine has idle capacity
                dispatch_at = self._adaptive_dispatch_time(now, oldest.deadline)
                if dispatch_at > now:
                    return min(dispatch_at, oldest.deadline) - now
                batch = self._compose(oldest.bucket, mixed=True)
            else:
                return oldest.deadline - now
            if batch:
                self._launch(batch, now)
        return None

    def _full_bucket(self) -> int | None:
        """The bucket holding a full batch whose oldest request is oldest, if any."""
        best: int | None = None
        best_seq = math.inf
        for bucket, size in enumerate(self._bucket_sizes):
            if size < self.max_batch_size:
                continue
            head = min(
                (next(iter(level)).seq for level in self._buckets[bucket] if level),
                default=math.inf,
            )
            if head < best_seq:
                best, best_seq = bucket, head
        return best

    def _adaptive_dispatch_time(self, now: float, deadline: float) -> float:
        """When waiting for more arrivals stops paying off (``<= now``: dispatch now).

        With ``m`` arrivals since ``t0`` (within the rate horizon) the rate estimate at
        time ``t`` is ``(m - 1) / (t - t0)``; a full batch needs ``missing`` more
        arrivals. Solving ``rate(t) * (deadline - t) = missing`` gives the time after which
        a full batch is not expected before the deadline. ``inf`` when a full (mixed)
        batch is already buffered: then only the deadline or a full bucket dispatch.
        """
        missing = self.max_batch_size - len(self._buffer)
        if missing <= 0:
            return math.inf
        while self._arrivals and self._arrivals[0] < now - self._rate_horizon_s:
            self._arrivals.popleft()
        gaps = len(self._arrivals) - 1
        if gaps <= 0:
            return -math.inf  # no recent rate: a cold start
        t0 = self._arrivals[0]
        return (gaps * deadline + missing * t0) / (gaps + missing)

    def _compose(self, bucket: int, *, mixed: bool) -> list[_Entry]:
        """Take up to ``max_batch_size`` entries out of the buffer, starting at ``bucket``.

        ``mixed`` tops the batch up from the other buckets, nearest lengths first; without
        a backlog a mixed batch takes the oldest entries of every bucket instead.
        """
        if mixed and len(self._buffer) <= _BACKLOG_BATCHES * self.max_batch_size:
            batch = self._take(self._buckets, self.max_batch_size, oldest_first=True)
            batch.sort(key=lambda e: e.seq)
            return batch
        groups = [self._buckets[bucket]]
        batch = self._take(groups, self.max_batch_size)
        if mixed and len(batch) < self.max_batch_size:
            others = sorted(
                (b for b in range(len(self._buckets)) if b != bucket),
                key=lambda b: (abs(b - bucket), b),
            )
            batch += self._take(
                [self._buckets[b] for b in others], self.max_batch_size - len(batch)
            )
        batch.sort(key=lambda e: e.seq)
        return batch

    def _take(
        self, groups: list[list[dict[_Entry, None]]], k: int, *, oldest_first: bool = False
    ) -> list[_Entry]:
        """Remove up to ``k`` entries from ``groups`` by fair share over priorities.

        Inside a priority level, entries come from the groups in order, oldest first
        inside a group (``oldest_first``: oldest first across the groups). Entries flagged
        cancelled are resolved as cancelled instead of being taken.
        """
        available = {p: sum(len(g[p]) for g in groups) for p in range(NUM_PRIORITIES)}
        counts = self._picker.pick(available, k)
        chosen: list[_Entry] = []
        for priority, count in enumerate(counts):
            levels = [group[priority] for group in groups if group[priority]]
            candidates: Iterator[_Entry]
            if oldest_first:
                candidates = heapq.merge(*levels, key=lambda e: e.seq)
            else:
                candidates = itertools.chain.from_iterable(levels)
            chosen += itertools.islice(candidates, count)
        taken: list[_Entry] = []
        for entry in chosen:
            self._remove(entry)
            if entry.request.is_cancelled:
                entry.state = "done"
                if not entry.future.done():
                    entry.future.set_result(_cancelled_output())
            else:
                taken.append(entry)
        return taken

    # --- running batches --------------------------------------------------------------
    def _launch(self, batch: list[_Entry], now: float) -> None:
        for entry in batch:
            entry.state = "running"
            metrics.BATCH_WAIT.observe(max(0.0, now - entry.arrival))
        task = asyncio.create_task(self._run_batch(batch), name="ponder-batch")
        self._running.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a batch task failed", exc_info=task.exception())
        self._wakeup.set()  # a slot is free

    async def _run_batch(self, batch: list[_Entry]) -> None:
        """Run one dispatched batch; every entry's future is resolved when it returns."""
        try:
            await self._execute(batch)
        except asyncio.CancelledError:
            _fail(batch, BatcherClosed("the batcher closed while this batch ran"))
            raise
        except Exception as e:  # a bug here must not leave submitters waiting forever
            _fail(batch, EngineError(f"the batcher failed to run the batch: {e!r}"))
            raise
        finally:
            for entry in batch:
                entry.state = "done"

    async def _execute(self, entries: list[_Entry]) -> None:
        """One engine call over the live entries; on a whole-batch failure, bisect.

        A batch the engine fails as a whole (it raises) is split in halves, each retried,
        until the failing row is alone: only a poisonous row fails. Rows whose submitter
        was cancelled are skipped. ``EngineDeadError`` fails every row without retrying.
        """
        live = [e for e in entries if not e.future.done()]
        if not live:
            return
        started = self._clock()
        try:
            results = await self.engine.generate([e.request for e in live])
        except EngineDeadError as e:
            self._observe_call(live, self._clock() - started, tokens=0)
            _fail(live, e)
            return
        except Exception as e:
            self._observe_call(live, self._clock() - started, tokens=0)
            if len(live) == 1:
                error = e if isinstance(e, EngineError) else _wrap(self.engine, e)
                _fail(live, error)
                return
            half = len(live) // 2
            await self._execute(live[:half])
            await self._execute(live[half:])
            return
        elapsed = self._clock() - started
        if not isinstance(results, list) or len(results) != len(live):
            count = len(results) if isinstance(results, list) else type(results).__name__
            self._observe_call(live, elapsed, tokens=0)
            _fail(
                live,
                EngineError(
                    f"engine {self.engine.name!r} returned {count} results for {len(live)} requests"
                ),
            )
            return
        tokens = 0
        for entry, result in zip(live, results, strict=True):
            if isinstance(result, SampleOutput):
                tokens += result.completion_tokens
                if not entry.future.done():  # done: the submitter was cancelled; drop it
                    entry.future.set_result(result)
            elif not entry.future.done():
                error = (
                    result
                    if isinstance(result, EngineError)
                    else EngineError(
                        f"engine {self.engine.name!r} returned {type(result).__name__} "
                        "instead of a SampleOutput or an EngineError"
                    )
                )
                entry.future.set_exception(error)
        self._observe_call(live, elapsed, tokens=tokens)

    def _observe_call(self, live: list[_Entry], elapsed_s: float, *, tokens: int) -> None:
        metrics.BATCH_SIZE.observe(len(live))
        metrics.BATCH_RUN.observe(max(0.0, elapsed_s))
        longest = max(e.length for e in live)
        if longest > 0:
            used = sum(e.length for e in live)
            metrics.BATCH_PADDING.observe(1 - used / (longest * len(live)))
        else:
            metrics.BATCH_PADDING.observe(0.0)
        if tokens and elapsed_s > 0:
            metrics.ENGINE_TOKENS_PER_S.labels(model=self.engine.served_model).set(
                tokens / elapsed_s
            )


def _fail(entries: list[_Entry], error: BaseException) -> None:
    """Fail every unresolved entry with ``error`` (one instance shared by the rows)."""
    for entry in entries:
        if not entry.future.done():
            entry.future.set_exception(error)


def _wrap(engine: BaseEngine, error: Exception) -> EngineError:
    wrapped = EngineError(f"engine {engine.name!r} raised {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


def _check_arguments(
    max_batch_size: int,
    max_wait_ms: float,
    max_buffer: int,
    max_concurrent_batches: int,
    bucket_edges: Sequence[int],
    priority_quotas: Sequence[int],
    clock: Callable[[], float],
) -> tuple[list[int], list[int]]:
    """ValueError for the first of :class:`DynamicBatcher`'s arguments out of range;
    else its bucket edges and priority quotas as lists."""
    _check_int("max_batch_size", max_batch_size, minimum=1)
    if not isinstance(max_wait_ms, int | float) or not 0 <= max_wait_ms < math.inf:
        raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
    _check_int("max_buffer", max_buffer, minimum=1)
    if max_buffer < max_batch_size:
        raise ValueError(
            f"max_buffer ({max_buffer}) must be at least max_batch_size "
            f"({max_batch_size}), or no batch could ever fill"
        )
    _check_int("max_concurrent_batches", max_concurrent_batches, minimum=1)
    edges = list(bucket_edges)
    for edge in edges:
        _check_int("each bucket edge", edge, minimum=1)
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"bucket_edges must be strictly increasing, got {edges}")
    quotas = list(priority_quotas)
    if len(quotas) != NUM_PRIORITIES:
        raise ValueError(
            f"priority_quotas needs one quota per priority 0..{NUM_PRIORITIES - 1} "
            f"({NUM_PRIORITIES} values), got {len(quotas)}: {quotas}"
        )
    if not callable(clock):
        raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
    return edges, quotas


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
