"""The dynamic batcher, driven by a fake engine and (mostly) a fake clock.

The fake engine records every call and, when ``hold`` is on, does not return until the
test releases the call, so tests control exactly when batches finish. With a fake clock
no deadline passes unless the test advances it; :func:`advance` then wakes the loop (a
real timer would, at the real deadline). Nothing here sleeps to wait for a condition:
tests await the engine's next call, or step the event loop a bounded number of times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ponder import metrics
from ponder.batcher import BatcherClosed, DynamicBatcher
from ponder.config import load_settings
from ponder.engines.base import BaseEngine, BatchResult, SampleOutput, SampleRequest
from ponder.errors import BatcherFull, EngineDeadError, EngineError

# --- test doubles --------------------------------------------------------------------


@dataclass
class Call:
    requests: list[SampleRequest]
    release: asyncio.Future[None] = field(default_factory=lambda: asyncio.Future())

    @property
    def prompts(self) -> list[str]:
        return [r.prompt or "" for r in self.requests]

    def finish(self) -> None:
        if not self.release.done():
            self.release.set_result(None)


class FakeEngine(BaseEngine):
    """Records batches; ``hold`` keeps each call open until the test calls ``finish``.

    Prompts steer it: one in ``poison`` fails any batch holding it, one in ``item_errors``
    fails its own row. ``words`` makes ``prompt_length`` count words (a "tokenizer").
    """

    name = "fake"

    def __init__(
        self,
        *,
        hold: bool = False,
        poison: Sequence[str] = (),
        item_errors: Sequence[str] = (),
        words: bool = False,
    ) -> None:
        self.hold = hold
        self.poison = set(poison)
        self.item_errors = set(item_errors)
        self.words = words
        self.calls: list[Call] = []
        self.raise_error: BaseException | None = None
        self.wrong_count = False
        self._started: asyncio.Queue[Call] = asyncio.Queue()

    async def submit(self, request: SampleRequest) -> SampleOutput:
        raise NotImplementedError("a whole-batch engine: the batcher calls generate()")

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        call = Call(list(batch))
        self.calls.append(call)
        self._started.put_nowait(call)
        if self.hold:
            await call.release
        if self.raise_error is not None:
            raise self.raise_error
        if any(r.prompt in self.poison for r in batch):
            raise EngineError("poisonous batch")
        if self.wrong_count:
            return []
        return [
            EngineError(f"row {r.prompt} failed")
            if r.prompt in self.item_errors
            else SampleOutput(text=f"out:{r.prompt}", completion_tokens=2)
            for r in batch
        ]

    def prompt_length(self, request: SampleRequest) -> int:
        if self.words:
            return len((request.prompt or "").split())
        return super().prompt_length(request)

    async def next_call(self) -> Call:
        return await asyncio.wait_for(self._started.get(), 5)

    def pending(self) -> int:
        return self._started.qsize()

    def release_all(self) -> None:
        self.hold = False
        for call in self.calls:
            call.finish()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


Make = Callable[..., DynamicBatcher]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Build and start batchers; release their engines and close them afterwards."""
    made: list[DynamicBatcher] = []

    def build(engine: BaseEngine, **kwargs: Any) -> DynamicBatcher:
        batcher = DynamicBatcher(engine, **kwargs)
        made.append(batcher)
        return batcher

    yield build
    for batcher in made:
        if isinstance(batcher.engine, FakeEngine):
            batcher.engine.release_all()
        await batcher.close()


async def started(make: Make, engine: BaseEngine, **kwargs: Any) -> DynamicBatcher:
    batcher = make(engine, **kwargs)
    await batcher.start()
    return batcher


async def settle(steps: int = 30) -> None:
    """Let every ready callback run (a bounded number of event-loop steps, no sleeping)."""
    for _ in range(steps):
        await asyncio.sleep(0)


async def advance(clock: FakeClock, batcher: DynamicBatcher, seconds: float) -> None:
    """Move the fake clock and wake the loop, as the real deadline timer would.

    Settles first, so that requests submitted just before arrive at the old time.
    """
    await settle()
    clock.now += seconds
    batcher._wakeup.set()
    await settle()


def req(prompt: str, priority: int = 3) -> SampleRequest:
    return SampleRequest(prompt=prompt, priority=priority)


def spawn(batcher: DynamicBatcher, prompt: str, priority: int = 3) -> asyncio.Task[SampleOutput]:
    return asyncio.create_task(batcher.submit(req(prompt, priority)))


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or None) or 0.0


# --- construction --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
        ({"max_wait_ms": -1}, "max_wait_ms must be a finite number >= 0"),
        ({"max_wait_ms": float("inf")}, "max_wait_ms"),
        ({"max_buffer": 0}, "max_buffer must be an integer >= 1"),
        ({"max_buffer": 4, "max_batch_size": 8}, r"max_buffer \(4\) must be at least"),
        ({"max_concurrent_batches": 0}, "max_concurrent_batches"),
        ({"bucket_edges": (64, 64)}, "strictly increasing"),
        ({"bucket_edges": (0, 5)}, "bucket edge"),
        ({"priority_quotas": (1, 1)}, "one quota per priority"),
        ({"priority_quotas": (1, 1, 1, 1, 1, 0)}, "priority 5"),
        ({"clock": 3.0}, "clock must be a callable"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DynamicBatcher(FakeEngine(), **kwargs)


def test_from_settings() -> None:
    settings = load_settings(
        batch_max_size=4,
        batch_max_wait_ms=7.5,
        batch_max_buffer=40,
        batch_max_concurrent=2,
        batch_bucket_edges="10,20",
        batch_adaptive=False,
        priority_quotas="6,5,4,3,2,1",
    )
    batcher = DynamicBatcher.from_settings(FakeEngine(), settings)
    assert batcher.max_batch_size == 4
    assert batcher.max_wait_ms == 7.5
    assert batcher.max_buffer == 40
    assert batcher.max_concurrent_batches == 2
    assert batcher.bucket_edges == (10, 20)
    assert batcher.adaptive is False
    assert batcher._picker.quotas == (6, 5, 4, 3, 2, 1)


async def test_lifecycle_errors(make: Make) -> None:
    batcher = make(FakeEngine())
    with pytest.raises(RuntimeError, match="start"):
        await batcher.submit(req("a"))
    await batcher.start()
    await batcher.start()  # idempotent
    with pytest.raises(ValueError, match=r"priority must be 0\.\.5"):
        await batcher.submit(req("a", priority=6))
    await batcher.close()
    await batcher.close()  # idempotent
    with pytest.raises(BatcherClosed, match="closed"):
        await batcher.submit(req("a"))
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.start()


# --- triggers --------------------------------------------------------------------------


async def test_full_batch_dispatches_at_once(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=clock)
    tasks = [spawn(batcher, f"r{i}") for i in range(3)]
    await settle()
    assert engine.calls == [] and batcher.depth() == 3  # the clock never moved
    tasks.append(spawn(batcher, "r3"))
    call = await engine.next_call()
    assert call.prompts == ["r0", "r1", "r2", "r3"]
    assert [t.text for t in await asyncio.gather(*tasks)] == [f"out:r{i}" for i in range(4)]
    assert batcher.depth() == 0


async def test_deadline_counts_from_the_oldest_arrival(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=50, adaptive=False, clock=clock)
    a = spawn(batcher, "a")
    await settle()
    await advance(clock, batcher, 0.030)
    b = spawn(batcher, "b")
    await advance(clock, batcher, 0.019)  # 49 ms after a's arrival
    assert engine.calls == []
    await advance(clock, batcher, 0.001)  # 50 ms after a, only 20 ms after b
    assert (await engine.next_call()).prompts == ["a", "b"]
    await asyncio.gather(a, b)


async def test_deadline_passed_while_engine_busy_dispatches_on_completion(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_wait_ms=50, adaptive=False, clock=clock)
    first = spawn(batcher, "first")
    await settle()
    await advance(clock, batcher, 0.050)
    running = await engine.next_call()
    await advance(clock, batcher, 0.010)
    late = spawn(batcher, "late")  # arrives while the engine is busy
    await settle()
    await advance(clock, batcher, 0.200)  # its deadline passes; no slot is free
    assert len(engine.calls) == 1 and batcher.depth() == 1
    running.finish()
    # dispatched as soon as the slot frees, without waiting 50 ms after the last dispatch
    assert (await engine.next_call()).prompts == ["late"]
    engine.release_all()
    await asyncio.gather(first, late)


async def test_real_clock_deadline_timer(make: Make) -> None:
    engine = FakeEngine()
    batcher = await started(make, engine, max_wait_ms=20, adaptive=False)
    t0 = time.monotonic()
    task = spawn(batcher, "a")
    await engine.next_call()
    waited = time.monotonic() - t0
    assert 0.019 <= waited < 2.0
    assert (await task).text == "out:a"


async def test_zero_wait_dispatches_immediately(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=0, adaptive=False, clock=clock)
    task = spawn(batcher, "a")
    assert (await engine.next_call()).prompts == ["a"]
    await task


async def test_idle_loop_does_not_poll(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=10_000, adaptive=False, clock=clock)
    task = spawn(batcher, "a")
    await settle()
    reads = clock.reads
    await asyncio.sleep(0.05)  # observing absence: a 10 ms poll would read the clock ~5 times
    assert clock.reads == reads
    await batcher.close()
    with pytest.raises(BatcherClosed):
        await task


# --- adaptive wait ---------------------------------------------------------------------


async def test_adaptive_cold_start_dispatches_without_waiting(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=50, adaptive=True, clock=clock)
    task = spawn(batcher, "a")
    assert (await engine.next_call()).prompts == ["a"]  # the clock never moved
    await task


async def test_adaptive_low_rate_dispatches_each_arrival_at_once(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=50, adaptive=True, clock=clock)
    for i in range(4):
        task = spawn(batcher, f"r{i}")
        assert (await engine.next_call()).prompts == [f"r{i}"]
        await task
        await advance(clock, batcher, 0.3)  # ~3 requests/s: a full batch never in 50 ms


async def test_adaptive_waits_while_a_full_batch_is_expected(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=8, max_wait_ms=50, adaptive=True, clock=clock
    )
    tasks = [spawn(batcher, "r0")]  # t = 0: cold start, runs at once
    first = await engine.next_call()
    for i in (1, 2):
        await advance(clock, batcher, 0.001)
        tasks.append(spawn(batcher, f"r{i}"))  # t = 1 ms, 2 ms: 1,000 requests/s
    await settle()
    first.finish()
    await settle()
    # Engine idle, 2 buffered, 6 missing. Rate (m-1)/(t-t0) = 2/t; the deadline is 51 ms.
    # 2 * (51 - t) / t = 6 at t = 12.75 ms: before that a full batch is still expected.
    await advance(clock, batcher, 0.0105)  # t = 12.5 ms
    assert len(engine.calls) == 1
    await advance(clock, batcher, 0.0005)  # t = 13 ms
    assert (await engine.next_call()).prompts == ["r1", "r2"]
    engine.release_all()
    await asyncio.gather(*tasks)


async def test_adaptive_uses_a_free_slot_while_another_batch_runs(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(
        make, engine, max_wait_ms=50, max_concurrent_batches=2, adaptive=True, clock=clock
    )
    first = spawn(batcher, "a")
    await engine.next_call()
    await advance(clock, batcher, 0.5)  # a slow trickle: a full batch is not expected
    second = spawn(batcher, "b")
    assert (await engine.next_call()).prompts == ["b"]  # the clock did not move
    engine.release_all()
    await asyncio.gather(first, second)


async def test_without_adaptive_a_lone_request_waits_for_its_deadline(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=50, adaptive=False, clock=clock)
    task = spawn(batcher, "a")
    await advance(clock, batcher, 0.049)
    assert engine.calls == []
    await advance(clock, batcher, 0.001)
    assert (await engine.next_call()).prompts == ["a"]
    await task


# --- bounded buffer and pipelining -------------------------------------------------------


async def test_full_buffer_raises_batcher_full(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=2, max_buffer=3, adaptive=False, clock=clock
    )
    tasks = [spawn(batcher, "a"), spawn(batcher, "b")]
    await engine.next_call()  # full: running, so no longer buffered
    tasks += [spawn(batcher, f"w{i}") for i in range(3)]
    await settle()
    assert batcher.depth() == 3
    with pytest.raises(BatcherFull, match="max_buffer=3"):
        await batcher.submit(req("over"))
    assert batcher.depth() == 3
    engine.release_all()
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)
    assert batcher.depth() == 0


async def test_next_batch_collects_while_one_runs(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=clock)
    tasks = [spawn(batcher, f"a{i}") for i in range(4)]
    first = await engine.next_call()
    tasks += [spawn(batcher, f"b{i}") for i in range(6)]
    await settle()
    assert len(engine.calls) == 1 and batcher.depth() == 6  # one batch at a time
    first.finish()
    second = await engine.next_call()
    assert second.prompts == ["b0", "b1", "b2", "b3"]
    assert batcher.depth() == 2
    engine.release_all()
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)


async def test_max_concurrent_batches_bounds_running_batches(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=2, max_concurrent_batches=2, adaptive=False, clock=clock
    )
    tasks = [spawn(batcher, f"r{i}") for i in range(6)]
    one, two = await engine.next_call(), await engine.next_call()
    await settle()
    assert (one.prompts, two.prompts) == (["r0", "r1"], ["r2", "r3"])
    assert engine.pending() == 0 and batcher.depth() == 2
    two.finish()
    assert (await engine.next_call()).prompts == ["r4", "r5"]
    engine.release_all()
    await asyncio.gather(*tasks)


# --- isolation --------------------------------------------------------------------------


async def test_poisonous_request_in_batch_of_8_fails_alone(make: Make) -> None:
    engine, clock = FakeEngine(poison=["r5"]), FakeClock()
    batcher = await started(make, engine, max_batch_size=8, adaptive=False, clock=clock)
    results = await asyncio.gather(
        *(batcher.submit(req(f"r{i}")) for i in range(8)), return_exceptions=True
    )
    for i, result in enumerate(results):
        if i == 5:
            assert isinstance(result, EngineError) and "poisonous" in str(result)
        else:
            assert isinstance(result, SampleOutput) and result.text == f"out:r{i}"
    # bisection, depth first: 8 fails; r0-r3 pass, r4-r7 fail; r4-r5 fail; r4 passes,
    # r5 fails alone; r6-r7 pass
    assert [c.prompts for c in engine.calls][1:] == [
        ["r0", "r1", "r2", "r3"],
        ["r4", "r5", "r6", "r7"],
        ["r4", "r5"],
        ["r4"],
        ["r5"],
        ["r6", "r7"],
    ]


async def test_per_item_error_fails_only_its_row(make: Make) -> None:
    engine, clock = FakeEngine(item_errors=["r3"]), FakeClock()
    batcher = await started(make, engine, max_batch_size=8, adaptive=False, clock=clock)
    results = await asyncio.gather(
        *(batcher.submit(req(f"r{i}")) for i in range(8)), return_exceptions=True
    )
    assert len(engine.calls) == 1
    assert isinstance(results[3], EngineError)
    assert all(isinstance(r, SampleOutput) for i, r in enumerate(results) if i != 3)


async def test_unexpected_engine_exception_is_wrapped(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    engine.raise_error = RuntimeError("boom")
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    results = await asyncio.gather(
        batcher.submit(req("a")), batcher.submit(req("b")), return_exceptions=True
    )
    for result in results:
        assert isinstance(result, EngineError) and "RuntimeError: boom" in str(result)
        assert isinstance(result.__cause__, RuntimeError)
    assert [len(c.requests) for c in engine.calls] == [2, 1, 1]


async def test_dead_engine_fails_every_row_without_bisecting(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    engine.raise_error = EngineDeadError("the model process died")
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=clock)
    results = await asyncio.gather(
        *(batcher.submit(req(f"r{i}")) for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, EngineDeadError) for r in results)
    assert len(engine.calls) == 1


async def test_wrong_result_count_fails_the_batch(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    engine.wrong_count = True
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    results = await asyncio.gather(
        batcher.submit(req("a")), batcher.submit(req("b")), return_exceptions=True
    )
    assert all(isinstance(r, EngineError) and "0 results for 2" in str(r) for r in results)


# --- cancellation ------------------------------------------------------------------------


async def test_cancelled_while_buffered_never_reaches_the_engine(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=clock)
    tasks = [spawn(batcher, f"r{i}") for i in range(3)]
    await settle()
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert batcher.depth() == 2  # removed at once
    tasks += [spawn(batcher, "r3"), spawn(batcher, "r4")]
    call = await engine.next_call()
    assert call.prompts == ["r0", "r2", "r3", "r4"]  # the size count saw the removal
    await asyncio.gather(tasks[0], *tasks[2:])


async def test_cancelled_between_dispatch_and_engine_call(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    blocker = [spawn(batcher, "x0"), spawn(batcher, "x1")]
    first = await engine.next_call()
    requests = [req("a"), req("b")]
    tasks = [asyncio.create_task(batcher.submit(r)) for r in requests]
    await settle()
    first.finish()
    for _ in range(100):  # step until the next batch is dispatched, not yet run
        if batcher.depth() == 0:
            break
        await asyncio.sleep(0)
    assert batcher.depth() == 0 and len(engine.calls) == 1
    tasks[0].cancel()  # the race: dispatched, its engine call not yet made
    second = await engine.next_call()
    assert second.prompts == ["b"]
    assert requests[0].is_cancelled
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    engine.release_all()
    assert (await tasks[1]).text == "out:b"
    await asyncio.gather(*blocker)


async def test_cancelled_while_running_drops_its_output(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=8, adaptive=False, clock=clock)
    requests = [req(f"r{i}") for i in range(8)]
    tasks = [asyncio.create_task(batcher.submit(r)) for r in requests]
    call = await engine.next_call()
    tasks[2].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[2]
    assert requests[2].is_cancelled  # the engine may stop spending compute on it
    assert call.requests[2] is requests[2]
    call.finish()
    outputs = await asyncio.gather(*(t for i, t in enumerate(tasks) if i != 2))
    assert [o.text for o in outputs] == [f"out:r{i}" for i in range(8) if i != 2]


async def test_every_row_cancelled_before_the_call_skips_the_engine(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    blocker = [spawn(batcher, "x0"), spawn(batcher, "x1")]
    first = await engine.next_call()
    tasks = [spawn(batcher, "a"), spawn(batcher, "b")]
    await settle()
    first.finish()
    for _ in range(100):
        if batcher.depth() == 0:
            break
        await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*blocker)
    await settle()
    assert len(engine.calls) == 1


async def buffered(
    make: Make,
) -> tuple[FakeEngine, DynamicBatcher, SampleRequest, asyncio.Task[SampleOutput]]:
    """One request in a batcher's buffer, no batch due (room for 4, a clock that stands):
    the engine, the batcher, the request and its submit."""
    engine = FakeEngine()
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=FakeClock())
    request = req("a")
    task = asyncio.create_task(batcher.submit(request))
    await settle()
    return engine, batcher, request, task


async def test_request_flag_cancel_while_buffered_removes_it(make: Make) -> None:
    engine, batcher, request, task = await buffered(make)
    assert batcher.depth() == 1
    request.cancel()  # e.g. from the worker's cancel watcher
    assert batcher.depth() == 0  # at once
    output = await task
    assert output.finish_reason == "cancelled"
    assert engine.calls == []


async def test_request_flag_cancel_from_another_thread(make: Make) -> None:
    engine, batcher, request, task = await buffered(make)
    await asyncio.to_thread(request.cancel)
    assert (await task).finish_reason == "cancelled"
    assert batcher.depth() == 0 and engine.calls == []


async def test_request_cancelled_before_submit_returns_at_once(make: Make) -> None:
    engine = FakeEngine()
    batcher = await started(make, engine)
    request = req("a")
    request.cancel()
    assert (await batcher.submit(request)).finish_reason == "cancelled"
    assert engine.calls == [] and batcher.depth() == 0


async def test_flagged_request_is_skipped_at_dispatch(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    flagged, other = req("a"), req("b")
    tasks = [asyncio.create_task(batcher.submit(r)) for r in (flagged, other)]
    flagged._cancelled = True  # the flag alone, without the callbacks: seen at dispatch
    await settle()
    await advance(clock, batcher, 0.05)
    assert [c.prompts for c in engine.calls] == [["b"]]
    assert (await tasks[0]).finish_reason == "cancelled"
    assert (await tasks[1]).text == "out:b"


# --- length buckets ------------------------------------------------------------------------


async def test_a_batch_draws_from_one_bucket(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=3, bucket_edges=(5,), adaptive=False, clock=clock
    )
    short = [f"s{i}" for i in range(3)]
    long = [f"long-{i}" for i in range(2)]
    tasks = [spawn(batcher, p) for p in (short[0], long[0], short[1], long[1], short[2])]
    assert (await engine.next_call()).prompts == short  # the short bucket filled
    await settle()
    assert len(engine.calls) == 1 and batcher.depth() == 2
    await advance(clock, batcher, 0.05)
    assert (await engine.next_call()).prompts == long
    await asyncio.gather(*tasks)


async def test_deadline_mixed_batch_without_backlog_takes_the_oldest(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=3, bucket_edges=(5, 10), adaptive=False, clock=clock
    )
    tasks = [spawn(batcher, "medium-1")]
    await advance(clock, batcher, 0.01)
    tasks += [spawn(batcher, p) for p in ("a-very-long-one", "s1", "s2")]
    await advance(clock, batcher, 0.039)
    assert engine.calls == []
    await advance(clock, batcher, 0.001)
    # 4 buffered <= 2 batches: no backlog, so the oldest go first whatever their length
    assert (await engine.next_call()).prompts == ["medium-1", "a-very-long-one", "s1"]
    await advance(clock, batcher, 0.05)
    assert (await engine.next_call()).prompts == ["s2"]
    await asyncio.gather(*tasks)


async def test_deadline_mixed_batch_with_backlog_packs_by_length(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=3, bucket_edges=(5, 10, 15), adaptive=False, clock=clock
    )
    tasks = [spawn(batcher, "medium-1")]
    await advance(clock, batcher, 0.01)
    later = [
        "a-very-very-long-one",
        "long-long-2",
        "s1",
        "another-very-long-one",
        "long-long-3",
        "medium-2",
        "s2",
    ]
    tasks += [spawn(batcher, p) for p in later]  # two per bucket: none is full
    await advance(clock, batcher, 0.039)
    assert engine.calls == []
    await advance(clock, batcher, 0.001)
    # 8 buffered > 2 batches: the oldest's bucket first, then the nearest bucket (shorter
    # first on a tie), though three longer requests arrived before s1
    assert (await engine.next_call()).prompts == ["medium-1", "s1", "medium-2"]
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)
    assert sorted(p for c in engine.calls for p in c.prompts) == sorted(["medium-1", *later])


async def test_buckets_use_the_engines_token_count(make: Make) -> None:
    engine, clock = FakeEngine(words=True), FakeClock()
    batcher = await started(
        make, engine, max_batch_size=2, bucket_edges=(3,), adaptive=False, clock=clock
    )
    # by characters these would split 1 / 2; by words (tokens) it is 2 / 1
    prompts = ["x", "a-very-long-word", "one two three four"]
    tasks = [spawn(batcher, p) for p in prompts]
    assert (await engine.next_call()).prompts == ["x", "a-very-long-word"]
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)


# --- priority ----------------------------------------------------------------------------


async def test_flood_of_priority_0_cannot_starve_priority_5(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=4, adaptive=True, clock=clock)
    tasks = [spawn(batcher, "warm", priority=0)]
    first = await engine.next_call()  # cold start: dispatched alone
    tasks += [spawn(batcher, f"p0-{i}", priority=0) for i in range(40)]
    tasks += [spawn(batcher, "p5-a", priority=5), spawn(batcher, "p5-b", priority=5)]
    await settle()
    first.finish()
    second = await engine.next_call()
    # 40 urgent requests arrived first, yet the fair share gives priority 5 a slot now
    assert "p5-a" in second.prompts
    engine.release_all()
    await advance(clock, batcher, 0.05)
    prompts = [c.prompts for c in engine.calls]
    p5_batches = [i for i, p in enumerate(prompts) if "p5-b" in p]
    assert p5_batches and p5_batches[0] <= 3  # long before the 40 urgent ones drain
    await asyncio.gather(*tasks)


async def test_fair_share_applies_without_a_backlog_too(make: Make) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_batch_size=4, adaptive=False, clock=clock)
    tasks = [spawn(batcher, f"p0-{i}", priority=0) for i in range(3)]
    tasks.append(spawn(batcher, "p5", priority=5))
    await settle()
    assert (await engine.next_call()).prompts == ["p0-0", "p0-1", "p0-2", "p5"]  # full
    tasks += [spawn(batcher, f"p0-{i}", priority=0) for i in range(3, 8)]
    tasks.append(spawn(batcher, "p5-late", priority=5))
    # 6 buffered (no backlog), 4 fit: at the deadline the oldest first, but the newest
    # request gets priority 5's share of the slots
    await advance(clock, batcher, 0.05)
    assert (await engine.next_call()).prompts == ["p0-3", "p0-4", "p0-5", "p5-late"]
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)


async def test_batches_follow_the_priority_quotas(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=13, adaptive=True, clock=clock)
    tasks = [spawn(batcher, "warm")]
    first = await engine.next_call()
    for level in range(6):
        tasks += [spawn(batcher, f"p{level}-{i}", priority=level) for i in range(30)]
    await settle()
    first.finish()
    for _ in range(3):
        call = await engine.next_call()
        counts = [sum(r.priority == level for r in call.requests) for level in range(6)]
        assert counts == [4, 3, 2, 2, 1, 1]
        call.finish()
    engine.release_all()
    await advance(clock, batcher, 0.05)
    await asyncio.gather(*tasks)


# --- metrics and shutdown ------------------------------------------------------------------


async def test_metrics_are_recorded(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    size = (sample("ponder_batch_size_count"), sample("ponder_batch_size_sum"))
    padding = sample("ponder_batch_padding_ratio_sum")
    waits = sample("ponder_batch_wait_seconds_count")
    runs = sample("ponder_batch_run_seconds_count")
    depth4 = sample("ponder_batcher_buffer_depth", priority="4")
    a = spawn(batcher, "ab", priority=4)
    await settle()
    assert sample("ponder_batcher_buffer_depth", priority="4") == depth4 + 1
    b = spawn(batcher, "abcd", priority=4)
    call = await engine.next_call()
    assert sample("ponder_batcher_buffer_depth", priority="4") == depth4
    call.finish()
    await asyncio.gather(a, b)
    assert sample("ponder_batch_size_count") == size[0] + 1
    assert sample("ponder_batch_size_sum") == size[1] + 2
    assert sample("ponder_batch_padding_ratio_sum") == pytest.approx(padding + 0.25)
    assert sample("ponder_batch_wait_seconds_count") == waits + 2
    assert sample("ponder_batch_run_seconds_count") == runs + 1


async def test_close_fails_buffered_and_awaits_running(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    running = [spawn(batcher, "a"), spawn(batcher, "b")]
    call = await engine.next_call()
    waiting = spawn(batcher, "c")
    await settle()
    closing = asyncio.create_task(batcher.close())
    with pytest.raises(BatcherClosed, match="closed before this request was dispatched"):
        await waiting
    await settle()
    assert not closing.done()  # a batch is still running
    call.finish()
    await closing
    assert [o.text for o in await asyncio.gather(*running)] == ["out:a", "out:b"]
    assert batcher._loop_task is not None and batcher._loop_task.done()


async def test_cancelled_close_cancels_running_batches(make: Make) -> None:
    engine, clock = FakeEngine(hold=True), FakeClock()
    batcher = await started(make, engine, max_batch_size=2, adaptive=False, clock=clock)
    running = [spawn(batcher, "a"), spawn(batcher, "b")]
    await engine.next_call()
    closing = asyncio.create_task(batcher.close())
    await settle()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    for task in running:
        with pytest.raises(BatcherClosed, match="while this batch ran"):
            await task
    assert not batcher._running


async def test_a_failing_dispatch_loop_fails_its_waiters(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, clock = FakeEngine(), FakeClock()
    batcher = await started(make, engine, max_wait_ms=0, adaptive=False, clock=clock)

    def broken(bucket: int, *, mixed: bool) -> list[Any]:
        raise RuntimeError("bug")

    monkeypatch.setattr(batcher, "_compose", broken)
    with pytest.raises(BatcherClosed, match="dispatch loop failed"):
        await batcher.submit(req("a"))
    with pytest.raises(BatcherClosed, match="RuntimeError"):
        await batcher.submit(req("b"))
