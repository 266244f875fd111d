"""Iteration-level scheduling (Orca, OSDI '22) for the engines that decode locally.

A :class:`ContinuousEngine` runs one loop in a thread of its own (the model thread). Each
iteration of the loop is one decode step:

1. **retire**: rows cancelled (``request.cancel()``) or past their ``timeout_s`` leave,
   with what they generated so far;
2. **admit**: while fewer than ``max_rows`` rows run, waiting rows are taken from the
   :class:`~ponder.scheduling.AdmissionQueue` by weighted fair share across priorities
   (optionally after waiting up to ``max_wait_ms`` to start several together, when few
   rows run), and prepared (tokenized, checked: a bad row fails alone);
3. **prefill**: admitted rows are prefilled under the engine's per-step budget and join
   the running batch (the subclass decides how: the transformers engine chunks a long
   prompt over several steps and reuses cached prompts);
4. **step**: every running row gets one more token;
5. **deliver**: rows that ended leave the batch, and their futures are resolved at once,
   on the event loop each came from (text pieces for ``request.on_text`` likewise, one
   callback per loop per step).

When there is nothing to do, the loop blocks on a condition (no polling): a submit, a
cancel or a close wakes it, and so does the next timed event (a row's deadline, the end of
an admission wait, a scripted row's delay). A loop that fails passes an
:class:`~ponder.errors.EngineDeadError` to every waiter and to every later submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

from ponder import metrics
from ponder.engines.base import BaseEngine, FinishReason, SampleOutput, SampleRequest
from ponder.errors import ConfigError, EngineDeadError, EngineError
from ponder.scheduling import AdmissionQueue

__all__ = ["ContinuousEngine", "EngineStats", "Row"]

log = logging.getLogger("ponder.engine")

#: how long ``start()`` waits for the model thread to load the model
_START_TIMEOUT_S = 900.0
#: an admission wait applies while fewer than this share of max_rows run
_FEW_ROWS_SHARE = 0.5
#: the tokens/s gauge is computed over windows of this length
_RATE_WINDOW_S = 1.0
#: a running row's text pieces go to its event loop at most this often (its first piece
#: and its last go at once)
_PIECES_EVERY_S = 0.02
#: the row gauges' states, in :meth:`ContinuousEngine._publish`'s order
_ROW_STATES = ("running", "prefilling", "queued")


@dataclass(eq=False)
class Row:
    """One submitted row as the loop sees it; engines subclass it with their own state."""

    request: SampleRequest
    future: asyncio.Future[SampleOutput]
    loop: asyncio.AbstractEventLoop
    priority: int
    #: when it was queued, on the engine's clock
    arrival: float
    #: when it was admitted (its timeout counts from here)
    started: float = 0.0
    deadline: float = math.inf
    #: the row makes no progress before this time (the scripted engine's delays)
    ready_at: float = -math.inf
    #: why the row ended, once it has
    finish: FinishReason | None = None
    #: the text pieces produced since the last delivery to ``request.on_text``
    pieces: list[str] = field(default_factory=list)
    #: when pieces were last delivered (engine clock)
    delivered_at: float = -math.inf
    #: when it was preempted (None: running, or never preempted); a row is preempted at
    #: most once, so a stream of urgent rows cannot starve it
    preempted_at: float | None = None
    was_preempted: bool = False
    #: whether it was admitted before (a preempted row is not prepared again)
    opened: bool = False

    def emit(self, piece: str) -> None:
        """Queue a piece of text for ``request.on_text`` (dropped when nobody listens)."""
        if piece and self.request.on_text is not None:
            self.pieces.append(piece)


@dataclass
class EngineStats:
    """Counters of the loop's work (tests and ``describe()`` read them)."""

    #: decode steps run
    steps: int = 0
    #: rows fed to decode steps, summed over the steps
    rows_stepped: int = 0
    #: rows admitted from the queue
    admitted: int = 0
    #: rows that joined while other rows were already running
    joined_running: int = 0
    #: the most rows that ran in one step
    max_rows_seen: int = 0
    #: prompt tokens computed by prefill passes
    prefill_tokens: int = 0
    #: prompts whose prefill was served by the prompt cache or shared with a batch mate
    prefix_hits: int = 0
    #: completion tokens generated
    tokens: int = 0
    #: running rows taken out for a more urgent waiting row (they resume later)
    preempted: int = 0


R = TypeVar("R", bound=Row)


class ContinuousEngine(BaseEngine, Generic[R]):
    """The loop of the module docstring; subclasses supply the model work.

    Subclasses set :attr:`row_class` (their :class:`Row` subclass) and implement
    :meth:`_setup` (load, in the model thread), :meth:`_open` (prepare an admitted row;
    raise EngineError to fail it), :meth:`_prefill` (make admitted rows ready to run),
    :meth:`_step` (one token for each ready running row; set ``row.finish`` on rows that
    end), :meth:`_drop` (rows left the batch) and :meth:`_output`.
    """

    #: the engine's row type (a :class:`Row` subclass with the engine's own state)
    row_class: type[R]
    #: whether a row's prefill samples its first token (else its first step does)
    first_token_at_prefill: bool = True

    def __init__(
        self,
        *,
        max_rows: int,
        max_queue: int,
        max_wait_ms: float,
        quotas: Sequence[int],
        preempt_after_ms: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_rows < 1:
            raise ConfigError(f"PONDER_ENGINE_MAX_ROWS must be at least 1, got {max_rows}")
        self.max_rows: int = max_rows
        self.max_wait_s = max(0.0, max_wait_ms) / 1000
        self.preempt_after_s = max(0.0, preempt_after_ms) / 1000
        self.stats = EngineStats()
        self._clock = clock
        self._queue: AdmissionQueue[R] = AdmissionQueue(quotas, max_queue)
        self._cond = threading.Condition()
        self._woken = False
        self._closing = False
        self._dead: EngineDeadError | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._start_lock = threading.Lock()
        #: rows admitted and not yet running (prefilling), then the running batch, in the
        #: order the subclass's batch holds them; both owned by the model thread
        self._joining: list[R] = []
        self._running: list[R] = []
        self._rate_since = clock()
        self._rate_tokens = 0
        #: the row counts last set on the gauges (running, prefilling, queued)
        self._published_rows: tuple[int, int, int] | None = None
        #: no rows are admitted, prefilled or stepped before this time (engine clock): the
        #: engine's process is down and restarts then (see :meth:`_supervise`); the loop
        #: wakes then even when idle; ``-inf``: nothing is blocked
        self._blocked_until = -math.inf

    # --- the async side ---------------------------------------------------------------
    async def start(self) -> None:
        """Start the model thread and wait until it has loaded the model. Idempotent."""
        if self._ready.is_set() and self._load_error is None and self._dead is None:
            return
        await asyncio.to_thread(self._start_blocking)

    def _start_blocking(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                if self._ready.is_set() and self._load_error is not None:
                    self._ready.clear()  # a failed load may be tried again
                self._closing = False
                self._dead = None
                self._load_error = None
                self._thread = threading.Thread(
                    target=self._main, name=f"ponder-{self.name}-model", daemon=True
                )
                self._thread.start()
            if not self._ready.wait(_START_TIMEOUT_S):
                raise EngineDeadError(f"the {self.name} engine did not start within 900 s")
            if self._load_error is not None:
                raise self._load_error

    async def submit(self, request: SampleRequest) -> SampleOutput:
        """Queue one row and await its output; see :mod:`ponder.engines.base`."""
        if self._dead is not None:
            raise self._dead
        await self.start()
        loop = asyncio.get_running_loop()
        row = self.row_class(
            request=request,
            future=loop.create_future(),
            loop=loop,
            priority=request.priority,
            arrival=self._clock(),
        )
        self._queue.put(row)  # EngineBusy when full
        dead = self._dead
        if dead is not None and self._queue.discard(row):
            raise dead  # the loop ended meanwhile and will not take it
        request.on_cancel(lambda: self._on_cancel(row))
        self._wake()
        try:
            return await row.future
        except asyncio.CancelledError:
            request.cancel()  # the loop retires it at the next step; the output is dropped
            raise

    async def close(self) -> None:
        """Stop the loop: queued and running rows fail with EngineDeadError. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        await asyncio.to_thread(thread.join, _START_TIMEOUT_S)
        self._thread = None
        self._ready.clear()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "rows_running": len(self._running),
            "rows_prefilling": len(self._joining),
            "rows_queued": len(self._queue),
            "queued_by_priority": self._queue.depths(),
            "max_rows": self.max_rows,
            **asdict(self.stats),
        }

    def health(self) -> str | None:
        dead = self._dead
        return None if dead is None else str(dead)

    def _on_cancel(self, row: R) -> None:
        """A queued row leaves the queue at once; a running one at the next step."""
        if self._queue.discard(row):
            _call_soon(row.loop, _settle, [(row.future, self._cancelled_output(row))])
        else:
            self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify()

    # --- the model thread -------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._setup()
        except BaseException as e:
            self._load_error = e
            self._dead = EngineDeadError(f"the {self.name} engine failed to start: {e}")
            self._ready.set()
            return
        self._ready.set()
        try:
            with self._context():
                while self._wait_for_work():
                    self._iteration()
        except BaseException as e:
            log.exception("the %s engine's model thread failed", self.name)
            self._dead = EngineDeadError(f"the {self.name} engine's model thread failed: {e!r}")
        finally:
            dead = self._dead or EngineDeadError(f"the {self.name} engine is closed")
            self._dead = dead
            waiting = self._queue.drain() + self._joining + self._running
            self._joining, self._running = [], []
            self._deliver([(row, dead) for row in waiting])
            with contextlib.suppress(Exception):
                self._teardown()
            self._publish()

    def _wait_for_work(self) -> bool:
        """Block until there is work (True) or the engine closes (False)."""
        with self._cond:
            while not self._closing:
                delay = self._next_work_in(self._clock())
                if self._woken or delay <= 0:
                    self._woken = False
                    return True
                self._cond.wait(None if delay == math.inf else delay)
            return False

    def _next_work_in(self, now: float) -> float:
        """Seconds until the loop has something to do (0: now; inf: only an event)."""
        soonest = math.inf
        if self._blocked_until > -math.inf:  # only a cancel, a deadline or the restart
            for row in self._joining + self._running:
                soonest = min(soonest, row.deadline)
            return min(soonest, self._blocked_until) - now
        if self._joining:
            return 0.0  # a prefill to advance
        for row in self._running:
            soonest = min(soonest, row.ready_at, row.deadline)
        if len(self._queue) and len(self._running) + len(self._joining) < self.max_rows:
            soonest = min(soonest, self._admission_time(now))
        return soonest - now

    def _admission_time(self, now: float) -> float:
        """When the queue's rows should be admitted (the optional wait to start together)."""
        if self.max_wait_s <= 0 or len(self._running) >= self.max_rows * _FEW_ROWS_SHARE:
            return now
        free = self.max_rows - len(self._running) - len(self._joining)
        oldest = self._queue.oldest_arrival()
        if oldest is None or len(self._queue) >= free:
            return now
        return oldest + self.max_wait_s

    def _iteration(self) -> None:
        self._blocked_until = self._supervise(self._clock())
        now = self._clock()
        finished = self._retire(now)
        if finished:
            self._leave(finished)
        if self._blocked_until > now:  # cancels and deadlines only, until the restart
            self._flush_pieces()
            self._publish()
            return
        self._admit(now)
        if self._joining:
            ready = self._prefill(self._joining, now)
            if ready:
                if self.first_token_at_prefill:
                    self.stats.tokens += len(ready)
                if self._running:
                    self.stats.joined_running += len(ready)
                self._running += ready
                ready_set = set(ready)
                self._joining = [r for r in self._joining if r not in ready_set]
        stepping = [r for r in self._running if r.ready_at <= now and r.finish is None]
        if stepping:
            produced = self._step(stepping)
            self.stats.steps += 1
            self.stats.rows_stepped += len(stepping)
            self.stats.tokens += len(stepping) if produced is None else produced
            self.stats.max_rows_seen = max(self.stats.max_rows_seen, len(stepping))
        ended = [r for r in self._joining + self._running if r.finish is not None]
        if ended:
            self._leave(ended)
        self._flush_pieces()
        self._publish()

    def _retire(self, now: float) -> list[R]:
        """Mark cancelled and timed-out rows finished; the ones that were marked."""
        out = []
        for row in self._joining + self._running:
            if row.finish is None and row.request.is_cancelled:
                row.finish = "cancelled"
            elif row.finish is None and now >= row.deadline:
                row.finish = "timeout"
            else:
                continue
            out.append(row)
        return out

    def _admit(self, now: float) -> None:
        free = self.max_rows - len(self._running) - len(self._joining)
        if free <= 0 and self.preempt_after_s > 0 and len(self._queue):
            free = self._preempt(now)
        if free <= 0 or not len(self._queue) or self._admission_time(now) > now:
            return
        for row in self._queue.take(free):
            if row.request.is_cancelled:
                self._deliver([(row, self._cancelled_output(row))])
                continue
            if row.preempted_at is not None:  # resumes: its time away does not count
                row.deadline += now - row.preempted_at
                row.preempted_at = None
                self._joining.append(row)
                continue
            row.started = now
            metrics.ENGINE_QUEUE_WAIT.observe(max(0.0, now - row.arrival))
            if row.request.timeout_s is not None:
                row.deadline = now + row.request.timeout_s
            try:
                self._open(row)
            except EngineError as e:
                self._deliver([(row, e)])
                continue
            row.opened = True
            self.stats.admitted += 1
            self._joining.append(row)

    def _preempt(self, now: float) -> int:
        """Free a slot for a row that waited ``preempt_after`` at a priority at least two
        levels more urgent than a running row's: the least urgent running row (the most
        recently started among equals; never one preempted before) goes back to the head
        of its queue and resumes later, recomputing its KV (vLLM's preemption by
        recompute). The slots freed."""
        overdue = [p for p, arrival in self._queue.heads() if now - arrival >= self.preempt_after_s]
        if not overdue:
            return 0
        urgent = min(overdue)
        victims = [
            r
            for r in self._running
            if r.priority >= urgent + 2 and r.finish is None and not r.was_preempted
        ]
        if not victims:
            return 0
        victim = max(victims, key=lambda r: (r.priority, r.started))
        self._take_out([victim])
        self._suspend(victim)
        victim.preempted_at, victim.was_preempted = now, True
        self._queue.requeue(victim)
        self.stats.preempted += 1
        return 1

    def _take_out(self, rows: Sequence[R]) -> None:
        """Remove ``rows`` from the running batch (and the subclass's) and the prefills."""
        leaving = set(rows)
        keep = [i for i, row in enumerate(self._running) if row not in leaving]
        if len(keep) < len(self._running):
            self._drop(keep)
            self._running = [self._running[i] for i in keep]
        self._joining = [r for r in self._joining if r not in leaving]

    def _leave(self, rows: list[R]) -> None:
        """Take ended rows out of the batch and resolve their futures."""
        self._take_out(rows)
        results: list[tuple[R, SampleOutput | BaseException]] = []
        for row in rows:
            try:
                results.append((row, self._output(row)))
            except Exception as e:  # e.g. a tokenizer failure: this row alone
                results.append((row, EngineError(f"cannot build the output: {e!r}")))
        self._flush_pieces(rows)
        self._deliver(results)

    def _fail(self, rows: Sequence[R], error: EngineError) -> None:
        """Fail ``rows`` (e.g. the rows of a failed forward pass) and take them out."""
        for row in rows:
            row.finish = "error"
        self._take_out(rows)
        self._deliver([(row, error) for row in rows])

    # --- delivery to the event loops --------------------------------------------------
    def _flush_pieces(self, rows: Sequence[R] | None = None) -> None:
        """Send the queued text pieces, one callback per event loop: all of ``rows`` (rows
        that end), else of the running rows whose first piece this is or whose last
        delivery is :data:`_PIECES_EVERY_S` old (a fast engine does not wake the event
        loop at every step; the deltas downstream are coarser still)."""
        now = self._clock()
        due = now - _PIECES_EVERY_S
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[str], object], str]]] = {}
        for row in self._running if rows is None else rows:
            if not row.pieces or row.request.on_text is None:
                continue
            if rows is None and row.delivered_at > due:
                continue
            by_loop.setdefault(row.loop, []).append((row.request.on_text, "".join(row.pieces)))
            row.pieces.clear()
            row.delivered_at = now
        for loop, calls in by_loop.items():
            _call_soon(loop, _run_callbacks, calls)

    def _deliver(self, results: Sequence[tuple[R, SampleOutput | BaseException]]) -> None:
        """Resolve futures, one callback per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[SampleOutput], Any]]]
        by_loop = {}
        for row, result in results:
            by_loop.setdefault(row.loop, []).append((row.future, result))
        for loop, items in by_loop.items():
            _call_soon(loop, _settle, items)

    def _publish(self) -> None:
        """Set the row gauges (when a count changed: this runs at every step) and, once a
        window, the tokens/s gauge."""
        rows = (len(self._running), len(self._joining), len(self._queue))
        if rows != self._published_rows:
            self._published_rows = rows
            model = self.served_model
            for state, count in zip(_ROW_STATES, rows, strict=True):
                metrics.ENGINE_ROWS.labels(state=state, model=model).set(count)
        now = self._clock()
        if now - self._rate_since >= _RATE_WINDOW_S:
            tokens = self.stats.tokens - self._rate_tokens
            rate = tokens / (now - self._rate_since)
            metrics.ENGINE_TOKENS_PER_S.labels(model=self.served_model).set(rate)
            self._rate_since, self._rate_tokens = now, self.stats.tokens

    def _cancelled_output(self, row: R) -> SampleOutput:
        return SampleOutput(text="", finish_reason="cancelled")

    # --- what engines implement -------------------------------------------------------
    def _context(self) -> contextlib.AbstractContextManager[Any]:
        """A context the loop runs in, entered once :meth:`_setup` has succeeded (e.g.
        ``torch.inference_mode()``)."""
        return contextlib.nullcontext()

    @abstractmethod
    def _setup(self) -> None:
        """Load the model (in the model thread). Raise ConfigError for a wrong setting."""

    def _teardown(self) -> None:
        """Release what :meth:`_setup` loaded (in the model thread, after the loop)."""

    def _supervise(self, now: float) -> float:
        """First in every iteration (the model thread): look after what the model runs in
        (the openvino engine restarts its engine process here). Returns the time before
        which no row can be admitted, prefilled or stepped (the loop then only retires
        cancelled and timed-out rows, and wakes by then); ``-inf``: none."""
        return -math.inf

    def _suspend(self, row: R) -> None:
        """A running row was taken out of the batch and will resume later: the next
        :meth:`_prefill` of it must rebuild its state (prompt and tokens so far)."""

    @abstractmethod
    def _open(self, row: R) -> None:
        """Prepare an admitted row (tokenize, check). EngineError fails it alone."""

    @abstractmethod
    def _prefill(self, rows: list[R], now: float) -> list[R]:
        """Advance the admitted rows' prefill; the ones now ready to run, in the order
        they joined the subclass's batch (they are appended to the running rows). A row
        whose first token ends it is not joined: set its ``finish`` instead."""

    @abstractmethod
    def _step(self, rows: list[R]) -> int | None:
        """One decode step for ``rows`` (running, ready, in batch order); set
        ``row.finish`` on rows that ended. Fail rows with :meth:`_fail` on an error.
        The tokens it produced (None: one per row)."""

    @abstractmethod
    def _drop(self, keep: list[int]) -> None:
        """Keep only the running rows at these indices (increasing) in the batch."""

    @abstractmethod
    def _output(self, row: R) -> SampleOutput:
        """The output of an ended row (``row.finish`` says why it ended)."""


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(callback, *args)


def _settle(items: list[tuple[asyncio.Future[SampleOutput], Any]]) -> None:
    for future, result in items:
        if future.done():  # the submitter gave up: drop it
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _run_callbacks(calls: list[tuple[Callable[[str], object], str]]) -> None:
    for callback, text in calls:
        try:
            callback(text)
        except Exception:
            log.exception("an on_text callback failed")
