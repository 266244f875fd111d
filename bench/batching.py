"""Benchmark: dynamic batching in front of a batched engine, against baselines and a peer.

Run with ``make bench-batching`` (``.venv/bin/python bench/batching.py``). Writes
``bench/results/batching.md`` and ``bench/results/batching.png``.

The engine is a whole-batch test double (:class:`BatchLatencyEngine`, answering like
ponder's scripted engine) with a latency model of
``200 ms + 6.7 ms per item`` per call (an A100's figures scaled 10x), so one batch of 8
takes 253.6 ms and the ideal full-batch throughput is 8 / 0.2536 s = 31.5 requests/s.
Arrivals are open-loop Poisson at 10 %, 50 %, 90 % and 150 % of that capacity, seeded, the
same sequence for every system, over a fixed duration per load; latency is measured from
each request's scheduled arrival to its output, so a late driver counts against the
system. After the last arrival a run gets ``--drain-s`` seconds to finish; unfinished
requests count as infinitely slow in the percentiles.

Systems, one batch running at a time in each:

a. ``none``: no batching, one request per engine call.
b. ``naive``: a loop that checks size / timeout every 10 ms with ``asyncio.sleep(0.01)``.
c. ``ray``: Ray Serve's ``@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)``
   around the same engine, run with ``.venv-peers/bin/python`` (ray is never a dependency
   of ponder). It runs the decorator's queue in-process, without a Serve deployment (no
   RPC), like the others; its constructor asks for a replica context only to log a
   ``max_ongoing_requests`` warning, so that check is patched out.
d. ``ponder``: :class:`ponder.batcher.DynamicBatcher` with its defaults (8, 50 ms,
   buckets 64/256/1024, adaptive), plus ablations: without the adaptive wait, without
   length buckets (padding waste with and without buckets), with mixed priorities (latency
   per priority), and with two batches at once (which the scripted engine overlaps for
   free, unlike one accelerator).

A simulated ``greedy`` reference (zero overhead: whenever the engine is idle, run up to 8
of whatever waits) is printed beside them, as what "one batch at a time" allows.

Section 6 runs the real local model (``TransformersEngine``) when it imports and loads,
and reports tokens/s per batch size; otherwise it says why it was skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the peers venv runs this file without ponder installed

from ponder.engines.base import BaseEngine, BatchResult, SampleOutput, SampleRequest  # noqa: E402
from ponder.errors import EngineBusy  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"

BASE_MS, PER_ITEM_MS = 200.0, 6.7
MAX_BATCH, MAX_WAIT_MS = 8, 50.0
BUCKET_EDGES = (64, 256, 1024)
LOADS = (0.10, 0.50, 0.90, 1.50)
#: arrival window per load (seconds): enough requests for stable percentiles, few minutes
DURATION_S = {0.10: 32.0, 0.50: 8.0, 0.90: 16.0, 1.50: 8.0}
DRAIN_S = 5.0
SEED = 20261129
MODEL_TOKENS, MODEL_REPEATS = 32, 2
MODEL_HEADING = "## Real local model"

Submit = Callable[[SampleRequest], Awaitable[SampleOutput]]


def batch_time_s(size: int) -> float:
    return (BASE_MS + PER_ITEM_MS * size) / 1000


def capacity_rps() -> float:
    """Requests/s of back-to-back full batches: the engine's ideal throughput."""
    return MAX_BATCH / batch_time_s(MAX_BATCH)


# --- workload --------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt: str
    priority: int


def workload(
    load: float, duration_s: float, *, mixed_priorities: bool = False, seed: int = SEED
) -> list[Arrival]:
    """Poisson arrivals at ``load`` x capacity; prompt lengths from a short/medium/long mix.

    Every request has priority 3 (the default) unless ``mixed_priorities``: then 0..5,
    3 the most common. The arrival times and prompts do not depend on that flag.
    """
    rng = random.Random(f"{seed}:{load}")
    rate = load * capacity_rps()
    arrivals: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return arrivals
        kind = rng.random()
        if kind < 0.6:
            length = rng.randint(12, 60)
        elif kind < 0.9:
            length = rng.randint(65, 250)
        else:
            length = rng.randint(260, 1000)
        head = f"q{len(arrivals)} "
        prompt = head + "x" * (length - len(head))
        priority = rng.choice((0, 1, 2, 3, 3, 3, 4, 5))
        arrivals.append(Arrival(t, prompt, priority if mixed_priorities else 3))


# --- engine wrapper --------------------------------------------------------------------


class BatchLatencyEngine(BaseEngine):
    """A whole-batch engine: each call takes ``batch_time_s(len(batch))``, one answer per
    row (what the batching systems here put in front of an accelerator)."""

    name = "batch-latency"

    async def submit(self, request: SampleRequest) -> SampleOutput:
        (result,) = await self.generate([request])
        assert isinstance(result, SampleOutput)
        return result

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        await asyncio.sleep(batch_time_s(len(batch)))
        return [SampleOutput(text="The answer is 1.", completion_tokens=5) for _ in batch]


class RecordingEngine(BaseEngine):
    """Delegates to the inner engine; records each call's sizes, lengths and times."""

    name = "recording"

    def __init__(self, inner: BaseEngine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], float, float]] = []
        #: id(request) -> (start, end) of the call that ran it last
        self.spans: dict[int, tuple[float, float]] = {}

    async def submit(self, request: SampleRequest) -> SampleOutput:
        (result,) = await self.generate([request])
        if not isinstance(result, SampleOutput):
            raise result
        return result

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        start = time.monotonic()
        result = await self.inner.generate(batch)
        end = time.monotonic()
        self.calls.append(([self.inner.prompt_length(r) for r in batch], start, end))
        for request in batch:
            self.spans[id(request)] = (start, end)
        return result

    def prompt_length(self, request: SampleRequest) -> int:
        return self.inner.prompt_length(request)


def make_engine() -> RecordingEngine:
    return RecordingEngine(BatchLatencyEngine())


# --- systems ---------------------------------------------------------------------------


class NoBatching:
    """(a) One request per engine call, one call at a time."""

    def __init__(self, engine: BaseEngine) -> None:
        self.engine = engine
        self._lock = asyncio.Lock()

    async def submit(self, request: SampleRequest) -> SampleOutput:
        async with self._lock:
            (result,) = await self.engine.generate([request])
        if not isinstance(result, SampleOutput):
            raise result
        return result


class NaiveBatcher:
    """(b) The baseline: check size / timeout every 10 ms; one batch at a time."""

    def __init__(self, engine: BaseEngine, max_batch: int, max_wait_s: float) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: list[tuple[float, SampleRequest, asyncio.Future[SampleOutput]]] = []

    async def submit(self, request: SampleRequest) -> SampleOutput:
        future: asyncio.Future[SampleOutput] = asyncio.get_running_loop().create_future()
        self.queue.append((time.monotonic(), request, future))
        return await future

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            if len(self.queue) >= self.max_batch or (
                self.queue and now - self.queue[0][0] >= self.max_wait_s
            ):
                batch, self.queue = self.queue[: self.max_batch], self.queue[self.max_batch :]
                results = await self.engine.generate([r for _, r, _ in batch])
                for (_, _, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, SampleOutput):
                        future.set_result(result)
                    else:
                        future.set_exception(result)
            else:
                await asyncio.sleep(0.01)


def ray_batched(engine: BaseEngine) -> Submit:
    """(c) Ray Serve's ``@serve.batch`` around ``engine`` (only in the peers venv)."""
    import ray.serve.batching as ray_batching  # type: ignore[import-not-found,unused-ignore]
    from ray import serve  # type: ignore[import-not-found,unused-ignore]

    # Outside a deployment, _BatchQueue's constructor fails in a check that only logs a
    # max_ongoing_requests warning (it reads the replica context); nothing else needs one.
    queue_class = ray_batching._BatchQueue
    queue_class._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda self: None

    class RayBatched:
        @serve.batch(  # type: ignore[untyped-decorator,misc,unused-ignore]
            max_batch_size=MAX_BATCH, batch_wait_timeout_s=MAX_WAIT_MS / 1000
        )
        async def submit(self, requests: list[SampleRequest]) -> BatchResult:
            return await engine.generate(requests)

    handler = RayBatched()

    async def submit(request: SampleRequest) -> SampleOutput:
        result = await handler.submit(request)
        if not isinstance(result, SampleOutput):
            raise result
        return result

    return submit


# --- driver ----------------------------------------------------------------------------


@dataclass
class RunResult:
    system: str
    load: float
    requests: int
    completed: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    #: p50 of (latency - engine time of the request's own batch): what batching added
    p50_added_ms: float
    batches: int
    mean_batch: float
    padding_waste: float
    notes: str = ""
    #: share of requests that arrived while no engine call ran, and their p50 latency
    idle_share: float = math.nan
    idle_p50_ms: float = math.nan
    #: priority -> (requests, p50 ms, p99 ms)
    by_priority: dict[int, tuple[int, float, float]] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; ``inf`` entries (unfinished requests) sort last."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


async def drive(
    system: str,
    load: float,
    arrivals: Sequence[Arrival],
    submit: Submit,
    engine: RecordingEngine,
    drain_s: float,
) -> RunResult:
    """Open-loop: send each request at its scheduled time, whatever is still running."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    latency = [math.inf] * len(arrivals)
    added = [math.inf] * len(arrivals)
    finished_at = [math.nan] * len(arrivals)

    async def one(i: int, arrival: Arrival) -> None:
        request = SampleRequest(prompt=arrival.prompt, priority=arrival.priority)
        scheduled = t0 + arrival.at_s
        delay_s = 0.001
        while True:
            try:
                await submit(request)
                break
            except EngineBusy:  # the worker's behaviour: back off and retry
                await asyncio.sleep(delay_s)
                delay_s = min(2 * delay_s, 0.5)
        now = loop.time()
        finished_at[i] = now
        latency[i] = now - scheduled
        span = engine.spans.get(id(request))
        if span is not None:
            added[i] = latency[i] - (span[1] - span[0])

    tasks: list[asyncio.Task[None]] = []
    for i, arrival in enumerate(arrivals):
        delay = t0 + arrival.at_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, arrival)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    cut = loop.time()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)

    completed = sum(1 for v in latency if math.isfinite(v))
    first = t0 + arrivals[0].at_s
    end = cut if pending else max(finished_at)
    sizes = [len(lengths) for lengths, _, _ in engine.calls]
    # loop.time() is time.monotonic(): arrival times and call spans share a clock
    spans = sorted((start, end) for _, start, end in engine.calls)
    starts = [start for start, _ in spans]

    def engine_busy(at: float) -> bool:
        i = bisect.bisect_right(starts, at) - 1
        return i >= 0 and spans[i][1] > at

    idle = [latency[i] for i, a in enumerate(arrivals) if not engine_busy(t0 + a.at_s)]
    slots = sum(len(lengths) * max(lengths) for lengths, _, _ in engine.calls)
    used = sum(sum(lengths) for lengths, _, _ in engine.calls)
    return RunResult(
        system=system,
        load=load,
        requests=len(arrivals),
        completed=completed,
        throughput_rps=completed / (end - first),
        p50_ms=percentile(latency, 50) * 1000,
        p99_ms=percentile(latency, 99) * 1000,
        p50_added_ms=percentile(added, 50) * 1000,
        batches=len(sizes),
        mean_batch=sum(sizes) / len(sizes) if sizes else 0.0,
        padding_waste=1 - used / slots if slots else 0.0,
        idle_share=len(idle) / len(arrivals),
        idle_p50_ms=percentile(idle, 50) * 1000 if idle else math.nan,
        notes=""
        if not pending
        else f"{len(pending)} unfinished {drain_s:g} s after the last arrival",
        by_priority={
            p: (
                len(values),
                percentile(values, 50) * 1000,
                percentile(values, 99) * 1000,
            )
            for p in sorted({a.priority for a in arrivals})
            for values in [[v for v, a in zip(latency, arrivals, strict=True) if a.priority == p]]
        },
    )


async def run_system(system: str, load: float, duration_s: float, drain_s: float) -> RunResult:
    arrivals = workload(load, duration_s, mixed_priorities=system == "ponder-priorities")
    engine = make_engine()
    owned: list[asyncio.Task[None]] = []
    closer: Callable[[], Awaitable[None]] | None = None
    if system == "none":
        submit: Submit = NoBatching(engine).submit
    elif system == "naive":
        naive = NaiveBatcher(engine, MAX_BATCH, MAX_WAIT_MS / 1000)
        owned.append(asyncio.create_task(naive.run()))
        submit = naive.submit
    elif system == "ray":
        submit = ray_batched(engine)
    elif system.startswith("ponder"):
        from ponder.batcher import DynamicBatcher

        batcher = DynamicBatcher(
            engine,
            max_batch_size=MAX_BATCH,
            max_wait_ms=MAX_WAIT_MS,
            bucket_edges=() if system == "ponder-nobuckets" else BUCKET_EDGES,
            adaptive=system != "ponder-noadaptive",
            max_concurrent_batches=2 if system == "ponder-concurrent2" else 1,
        )
        await batcher.start()
        submit, closer = batcher.submit, batcher.close
    else:
        raise ValueError(f"unknown system {system!r}")
    try:
        return await drive(system, load, arrivals, submit, engine, drain_s)
    finally:
        if closer is not None:
            await closer()
        for task in owned:
            task.cancel()
        await asyncio.gather(*owned, return_exceptions=True)


def simulate(arrivals: Sequence[float], wait_s: float) -> tuple[list[float], int, float]:
    """Zero-overhead batching, one batch at a time: (latencies, batches, end time).

    A batch starts when the engine is free and either its oldest request has waited
    ``wait_s`` or ``MAX_BATCH`` requests wait; it takes up to ``MAX_BATCH`` of them.
    ``wait_s=0`` is the greedy policy: whenever the engine is idle, run what waits.
    """
    latency: list[float] = []
    free_at, i, batches = 0.0, 0, 0
    n = len(arrivals)
    while i < n:
        start = max(free_at, arrivals[i] + wait_s)
        if i + MAX_BATCH - 1 < n and arrivals[i + MAX_BATCH - 1] < start:
            start = max(free_at, arrivals[i + MAX_BATCH - 1])
        j = i
        while j < n and arrivals[j] <= start and j - i < MAX_BATCH:
            j += 1
        end = start + batch_time_s(j - i)
        latency += [end - arrivals[k] for k in range(i, j)]
        free_at, i, batches = end, j, batches + 1
    return latency, batches, free_at


def greedy_reference(load: float, duration_s: float) -> RunResult:
    """The greedy policy simulated on the run's own arrivals."""
    arrivals = [a.at_s for a in workload(load, duration_s)]
    latency, batches, end = simulate(arrivals, 0.0)
    return RunResult(
        system="greedy (sim)",
        load=load,
        requests=len(arrivals),
        completed=len(arrivals),
        throughput_rps=len(arrivals) / (end - arrivals[0]),
        p50_ms=percentile(latency, 50) * 1000,
        p99_ms=percentile(latency, 99) * 1000,
        p50_added_ms=math.nan,
        batches=batches,
        mean_batch=len(arrivals) / batches,
        padding_waste=math.nan,
    )


def long_run_lines(count: int = 40_000) -> list[str]:
    """Percentiles of long simulated runs: how noisy the short measured runs are."""
    lines = [
        f"Zero-overhead simulation, {count:,} Poisson arrivals per load (seeded), one batch at "
        "a time: **greedy** dispatches whenever the engine is idle (what the adaptive wait "
        "does at low load), **wait 50 ms** waits for a full batch or the oldest request's "
        "50 ms (the deadline-only policy of the naive loop, without its 10 ms polling).",
        "",
        "| load | greedy p50 (ms) | greedy p99 (ms) | wait 50 ms p50 (ms) | wait 50 ms p99 (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for load in (x for x in LOADS if x < 1):  # an overload's queue grows without bound
        rng = random.Random(f"{SEED}:long:{load}")
        t, arrivals = 0.0, []
        for _ in range(count):
            t += rng.expovariate(load * capacity_rps())
            arrivals.append(t)
        greedy, _, _ = simulate(arrivals, 0.0)
        waiting, _, _ = simulate(arrivals, MAX_WAIT_MS / 1000)
        cells = [
            f"{percentile(values, q) * 1000:.0f}" for values in (greedy, waiting) for q in (50, 99)
        ]
        lines.append(f"| {load:.0%} | " + " | ".join(cells) + " |")
    return lines


# --- the whole run ---------------------------------------------------------------------

PLAN: list[tuple[str, tuple[float, ...]]] = [
    ("none", LOADS),
    ("naive", LOADS),
    ("ponder", LOADS),
    ("ponder-noadaptive", (0.10,)),
    ("ponder-nobuckets", (0.90, 1.50)),
    ("ponder-priorities", (0.90,)),
    ("ponder-concurrent2", (0.10,)),
]


async def run_in_process(
    systems: Sequence[tuple[str, Sequence[float]]], scale: float, drain_s: float
) -> list[RunResult]:
    results = []
    for system, loads in systems:
        for load in loads:
            result = await run_system(system, load, DURATION_S[load] * scale, drain_s)
            print(
                f"{system:>18} {load:>5.0%}: {result.throughput_rps:6.2f} req/s  "
                f"p50 {result.p50_ms:8.1f} ms  p99 {result.p99_ms:8.1f} ms  "
                f"batch {result.mean_batch:4.2f}  {result.notes}",
                flush=True,
            )
            results.append(result)
    return results


def run_ray(scale: float, drain_s: float) -> tuple[list[RunResult], str]:
    """Run the Ray part in the peers venv; ([], reason) when it cannot run."""
    if not PEERS_PYTHON.exists():
        return [], f"{PEERS_PYTHON.relative_to(ROOT)} does not exist; run `make peers`"
    probe = subprocess.run(
        [str(PEERS_PYTHON), "-c", "import ray, ray.serve; print(ray.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return [], f"ray does not import in .venv-peers: {probe.stderr.strip()[-400:]}"
    version = probe.stdout.strip()
    out = RESULTS / ".ray-results.json"
    command = [
        str(PEERS_PYTHON),
        str(Path(__file__).resolve()),
        "--ray-worker",
        "--scale",
        str(scale),
        "--drain-s",
        str(drain_s),
        "--json-out",
        str(out),
    ]
    proc = subprocess.run(command, text=True, capture_output=True, check=False)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        return [], f"the ray run failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}"
    rows = []
    for row in json.loads(out.read_text()):
        row["by_priority"] = {int(p): tuple(v) for p, v in row["by_priority"].items()}
        rows.append(RunResult(**row))
    out.unlink()
    return rows, f"ray {version}"


# --- the local model -------------------------------------------------------------------


async def model_section(budget_s: float = 150.0) -> list[str]:
    """Tokens/s per batch size of the real local model, or why it was skipped."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from ponder.config import load_settings
        from ponder.engines.openvino import OpenVINOEngine
    except Exception as e:
        return [f"Skipped: `ponder.engines.openvino` does not import ({e!r})."]
    # one engine thread gives steadier figures on a shared machine
    settings = load_settings(engine="openvino", engine_threads=1)
    started = time.monotonic()
    try:
        engine = OpenVINOEngine(settings)
        await asyncio.wait_for(engine.start(), budget_s)
    except Exception as e:
        return [f"Skipped: `OpenVINOEngine` did not load model {settings.model!r} ({e!r})."]
    lines = [
        f"Model `{settings.model}` ({engine.model_name}), loaded in "
        f"{time.monotonic() - started:.1f} s; greedy decoding, up to {MODEL_TOKENS} new tokens "
        f"per row, distinct prompts, {os.cpu_count()} CPU cores, {settings.engine_threads} engine "
        f"thread(s) (`PONDER_ENGINE_THREADS`); best of {MODEL_REPEATS} calls per batch size.",
        "",
        "| batch size | call time (s) | completion tokens | tokens/s | vs batch 1 |",
        "|---:|---:|---:|---:|---:|",
    ]

    def requests(size: int) -> list[SampleRequest]:
        return [
            SampleRequest(
                prompt=f"Write a long story about a dragon called Ember-{i}.",
                max_new_tokens=MODEL_TOKENS,
                temperature=0.0,
                sample_index=i,
            )
            for i in range(size)
        ]

    base_rate = None
    try:
        await engine.generate(requests(1))  # warm-up: first calls allocate and tune kernels
        for size in (1, 2, 4, 8):
            best: tuple[float, int] | None = None
            for _ in range(MODEL_REPEATS):
                t = time.monotonic()
                results = await engine.generate(requests(size))
                elapsed = time.monotonic() - t
                tokens = sum(r.completion_tokens for r in results if isinstance(r, SampleOutput))
                if best is None or tokens / elapsed > best[1] / best[0]:
                    best = (elapsed, tokens)
            assert best is not None
            elapsed, tokens = best
            rate = tokens / elapsed
            base_rate = base_rate or rate
            lines.append(
                f"| {size} | {elapsed:.2f} | {tokens} | {rate:.1f} | {rate / base_rate:.2f}x |"
            )
            if time.monotonic() - started > budget_s:
                lines += ["", f"Stopped after batch size {size}: over the {budget_s:g} s budget."]
                break
        else:
            # the same rows through ponder's batcher: 16 submitted at once, batches of 8
            from ponder.batcher import DynamicBatcher

            batcher = DynamicBatcher(engine, max_batch_size=8)
            await batcher.start()
            try:
                t = time.monotonic()
                outputs = await asyncio.gather(*(batcher.submit(r) for r in requests(16)))
                elapsed = time.monotonic() - t
            finally:
                await batcher.close()
            tokens = sum(o.completion_tokens for o in outputs)
            lines += [
                "",
                f"Through `DynamicBatcher` (16 requests submitted at once, max batch 8): "
                f"{elapsed:.2f} s, {tokens} tokens, {tokens / elapsed:.1f} tokens/s.",
            ]
    except Exception as e:
        lines += ["", f"The model run failed: {e!r}"]
    finally:
        await engine.close()
    return lines


# --- report ----------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    if math.isinf(value):
        return "unfinished"
    if math.isnan(value):
        return "-"
    return f"{value:.0f}"


def write_report(
    results: list[RunResult],
    references: list[RunResult],
    ray_note: str,
    model_lines: list[str],
    args: argparse.Namespace,
    wall_s: float,
) -> Path:
    ideal = capacity_rps()
    single_ms = batch_time_s(1) * 1000
    by = {(r.system, r.load): r for r in results}
    ref = {r.load: r for r in references}
    order = [
        "none",
        "naive",
        "ray",
        "ponder",
        "ponder-noadaptive",
        "ponder-nobuckets",
        "ponder-priorities",
        "ponder-concurrent2",
    ]
    lines = [
        "# Batching benchmark",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'bench/batching.py', *sys.argv[1:]])}` "
        f"(`make bench-batching`); {wall_s / 60:.1f} min on {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; load "
        f"average at the end {os.getloadavg()[0]:.1f} (the machine is shared: other "
        "processes add event-loop jitter).",
        "",
        f"Engine: ScriptedEngine, {BASE_MS:g} ms + {PER_ITEM_MS:g} ms per item per call; "
        f"batch of 1 = {single_ms:.1f} ms, batch of {MAX_BATCH} = "
        f"{batch_time_s(MAX_BATCH) * 1000:.1f} ms; ideal full-batch throughput "
        f"{ideal:.2f} req/s. Batchers: max {MAX_BATCH}, wait {MAX_WAIT_MS:g} ms, one batch "
        "at a time. Poisson arrivals (seed "
        f"{SEED}), the same per load for every system; arrival windows "
        + ", ".join(f"{load:.0%}: {DURATION_S[load] * args.scale:g} s" for load in LOADS)
        + f"; {args.drain_s:g} s to drain after the last arrival (unfinished requests count "
        "as infinitely slow). Prompt lengths: 60 % 12-60, 30 % 65-250, 10 % 260-1000 "
        "characters.",
        "",
        "Systems: **none** = one request per engine call; **naive** = 10 ms "
        "`asyncio.sleep` polling loop; **ray** = Ray Serve `@serve.batch` (in-process, no "
        "deployment); **ponder** = `DynamicBatcher` defaults; **ponder-noadaptive** / "
        "**ponder-nobuckets** / **ponder-priorities** (mixed priorities 0..5) / "
        "**ponder-concurrent2** (`max_concurrent_batches=2`) = ablations; "
        "**greedy (sim)** = a simulated zero-overhead "
        "batcher that runs up to 8 waiting requests whenever the engine is idle (a reference, "
        "not a bound).",
        "",
        f"Ray: {ray_note}.",
        "",
    ]
    for load in LOADS:
        lines += [
            f"## Load {load:.0%} ({load * ideal:.1f} req/s offered)",
            "",
            "| system | requests | done | throughput (req/s) | x ideal | p50 (ms) | p99 (ms) "
            "| p50 added over own engine call (ms) | arrived at idle engine | their p50 (ms) "
            "| batches | mean batch | padding waste |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        rows = [by[(s, load)] for s in order if (s, load) in by]
        if load in ref:
            rows.append(ref[load])
        for r in rows:
            waste = "-" if math.isnan(r.padding_waste) else f"{r.padding_waste:.1%}"
            idle_share = "-" if math.isnan(r.idle_share) else f"{r.idle_share:.0%}"
            lines.append(
                f"| {r.system} | {r.requests} | {r.completed} | {r.throughput_rps:.2f} "
                f"| {r.throughput_rps / ideal:.3f} | {fmt_ms(r.p50_ms)} | {fmt_ms(r.p99_ms)} "
                f"| {fmt_ms(r.p50_added_ms)} | {idle_share} | {fmt_ms(r.idle_p50_ms)} "
                f"| {r.batches} | {r.mean_batch:.2f} | {waste} |"
            )
        notes = [f"{r.system}: {r.notes}" for r in rows if r.notes]
        if notes:
            lines += ["", "Notes: " + "; ".join(notes) + "."]
        lines.append("")

    lines += ["## Goals (ratios from this run)", ""]
    ponder_150 = by.get(("ponder", 1.50))
    ponder_10 = by.get(("ponder", 0.10))
    ponder_90 = by.get(("ponder", 0.90))
    naive_90 = by.get(("naive", 0.90))
    ray_90 = by.get(("ray", 0.90))
    if ponder_150:
        ratio = ponder_150.throughput_rps / ideal
        lines.append(
            f"- Throughput at 150 % load / ideal full-batch throughput: **{ratio:.3f}** "
            f"(goal >= 0.95: {'met' if ratio >= 0.95 else 'MISSED'})."
        )
    if ponder_10:
        gap = ponder_10.p50_ms - single_ms
        ref10 = ref.get(0.10)
        lines.append(
            f"- p50 at 10 % load: {ponder_10.p50_ms:.1f} ms = engine time of a lone request "
            f"({single_ms:.1f} ms) {gap:+.1f} ms, ratio {ponder_10.p50_ms / single_ms:.3f} "
            f"(goal <= +5 ms: {'met' if gap <= 5 else 'MISSED'}). Time added on top of the "
            f"request's own engine call, p50: {ponder_10.p50_added_ms:.1f} ms "
            f"({'met' if ponder_10.p50_added_ms <= 5 else 'MISSED'} in that reading)."
            + (
                f" The zero-overhead greedy reference has p50 {ref10.p50_ms:.1f} ms on the "
                "same arrivals: a request that arrives while the engine is busy must wait "
                "for it, whatever the batcher does."
                if ref10
                else ""
            )
        )
        none_10 = by.get(("none", 0.10))
        lines.append(
            f"  The {ponder_10.idle_share:.0%} of requests that arrived while the engine was "
            f"idle: p50 {ponder_10.idle_p50_ms:.1f} ms = engine time "
            f"{ponder_10.idle_p50_ms - single_ms:+.1f} ms (ratio "
            f"{ponder_10.idle_p50_ms / single_ms:.3f}; "
            f"{'met' if ponder_10.idle_p50_ms - single_ms <= 5 else 'MISSED'} for them)."
            + (
                f" With no batcher at all (none) the same figure is {none_10.idle_p50_ms:.1f} "
                "ms: the scripted engine's own sleep and event-loop overhead on this machine; "
                f"the batcher adds {ponder_10.idle_p50_ms - none_10.idle_p50_ms:+.1f} ms to it."
                if none_10
                else ""
            )
        )
        for name, label in (
            ("ponder-noadaptive", "without the adaptive wait"),
            ("naive", "naive"),
        ):
            other = by.get((name, 0.10))
            if other:
                lines.append(
                    f"  {label.capitalize()}: p50 {other.p50_ms:.1f} ms, idle arrivals' p50 "
                    f"{other.idle_p50_ms:.1f} ms (ponder / {name} = "
                    f"{ponder_10.p50_ms / other.p50_ms:.3f} overall, "
                    f"{ponder_10.idle_p50_ms / other.idle_p50_ms:.3f} for idle arrivals)."
                )
        concurrent = by.get(("ponder-concurrent2", 0.10))
        if concurrent:
            lines.append(
                f"  With `max_concurrent_batches=2`, p50 at 10 % is {concurrent.p50_ms:.1f} ms "
                f"({concurrent.p50_ms - single_ms:+.1f} ms), but only because the scripted "
                "engine overlaps two calls for free (two sleeps); one accelerator would not."
            )
    if ponder_90 and naive_90:
        ratio = ponder_90.p99_ms / naive_90.p99_ms
        lines.append(
            f"- p99 at 90 % load, ponder / naive: **{ratio:.3f}** ({ponder_90.p99_ms:.0f} vs "
            f"{naive_90.p99_ms:.0f} ms; goal < 1: {'met' if ratio < 1 else 'MISSED'})."
        )
    if ponder_90 and ray_90 and math.isinf(ray_90.p99_ms):
        lines.append(
            f"- p99 at 90 % load vs ray: ponder {ponder_90.p99_ms:.0f} ms; ray's p99 request "
            f"did not finish within {args.drain_s:g} s of the last arrival (goal <= 1: met)."
        )
    elif ponder_90 and ray_90:
        ratio = ponder_90.p99_ms / ray_90.p99_ms
        lines.append(
            f"- p99 at 90 % load, ponder / ray: **{ratio:.3f}** ({ponder_90.p99_ms:.0f} vs "
            f"{ray_90.p99_ms:.0f} ms; goal <= 1: {'met' if ratio <= 1 else 'MISSED'})."
        )
    elif ponder_90:
        lines.append("- p99 at 90 % load vs ray: not measured (see the Ray line above).")
    pad_lines = []
    for load in LOADS:
        a, b = by.get(("ponder", load)), by.get(("ponder-nobuckets", load))
        if a and b:
            pad_lines.append(
                f"{load:.0%}: {a.padding_waste:.1%} with buckets, {b.padding_waste:.1%} without"
            )
    if pad_lines:
        lines.append(
            "- Padding waste (share of prompt slots that are padding): "
            + "; ".join(pad_lines)
            + "."
        )
    prio = by.get(("ponder-priorities", 0.90))
    if prio:
        lines += [
            "",
            "## Priorities at 90 % load (ponder, mixed priorities)",
            "",
            "The same arrivals with priorities 0..5 (3 the most common); quotas 4,3,2,2,1,1.",
            "",
            "| priority | requests | p50 (ms) | p99 (ms) |",
            "|---:|---:|---:|---:|",
        ]
        for p, (count, p50, p99) in sorted(prio.by_priority.items()):
            lines.append(f"| {p} | {count} | {fmt_ms(p50)} | {fmt_ms(p99)} |")
    lines += ["", "## Long-run reference", "", *long_run_lines()]
    lines += ["", "## Reading the results", ""]
    lines += reading_notes(by)
    lines += ["", MODEL_HEADING, "", *model_lines, ""]
    path = RESULTS / "batching.md"
    path.write_text("\n".join(lines))
    return path


def reading_notes(by: dict[tuple[str, float], RunResult]) -> list[str]:
    """Mechanisms behind the figures (the numbers come from this run)."""
    notes = []
    ray_rows = [by[("ray", load)] for load in LOADS if ("ray", load) in by]
    if ray_rows:
        sizes = ", ".join(f"{r.load:.0%}: {r.mean_batch:.2f}" for r in ray_rows)
        notes.append(
            "- Ray's `@serve.batch` closes a batch `batch_wait_timeout_s` after it starts "
            "collecting it and then queues the batch for its `max_concurrent_batches` "
            "semaphore (`_BatchQueue._process_batches` in ray/serve/batching.py): the next "
            "batch is collected, and closed, while the engine is still busy. With an engine "
            "call (>= 200 ms) much longer than the 50 ms wait, its batches stay small (mean "
            f"batch {sizes}), so it saturates well below the engine's capacity."
        )
    a, b = by.get(("ponder", 0.90)), by.get(("ponder-nobuckets", 0.90))
    c, d = by.get(("ponder", 1.50)), by.get(("ponder-nobuckets", 1.50))
    if a and b and c and d:
        notes.append(
            "- Length buckets reorder requests. Under a backlog (more than 2 batches "
            "buffered) a deadline-forced batch takes the oldest request's bucket first and "
            "tops up from the nearest buckets, so a request of a far bucket can be left for "
            "the next batch; without a backlog it takes the oldest requests of any length. "
            "The scripted engine's latency does not depend on prompt length, so here buckets "
            "can only cost latency, never save it: at 90 % "
            f"p99 is {a.p99_ms:.0f} ms with buckets vs {b.p99_ms:.0f} ms without, padding "
            f"waste {a.padding_waste:.1%} vs {b.padding_waste:.1%}; at 150 % p99 "
            f"{c.p99_ms:.0f} vs {d.p99_ms:.0f} ms, padding waste {c.padding_waste:.1%} vs "
            f"{d.padding_waste:.1%}. On a real model padded prompt slots cost prefill "
            "compute; `PONDER_BATCH_BUCKET_EDGES=` (empty) turns buckets off."
        )
    e, f = by.get(("ponder", 0.10)), by.get(("naive", 0.10))
    g = by.get(("ponder-noadaptive", 0.10))
    if e and f and g:
        notes.append(
            "- At 10 % load, one-request batches would keep the engine busy "
            f"{min(1.0, e.load * capacity_rps() * batch_time_s(1)):.0%} of the time, so most "
            "requests arrive while a batch runs and must wait for it (one batch at a time): "
            "that queueing sets the overall p50, and on one short sample it is noisy (the "
            "long-run reference above gives the expected gap between the two policies). The "
            "adaptive wait acts on the requests that arrive at an idle engine: their p50 is "
            f"{e.idle_p50_ms:.1f} ms with ponder, {g.idle_p50_ms:.1f} ms without the adaptive "
            f"wait, {f.idle_p50_ms:.1f} ms with the naive loop (engine time "
            f"{batch_time_s(1) * 1000:.1f} ms)."
        )
    return notes


def plot(results: list[RunResult], references: list[RunResult]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ideal = capacity_rps()
    fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.8))
    systems = ["none", "naive", "ray", "ponder", "ponder-noadaptive", "ponder-nobuckets"]
    colors = dict(
        zip(
            systems,
            ["tab:gray", "tab:orange", "tab:purple", "tab:blue", "tab:cyan", "tab:green"],
            strict=True,
        )
    )
    for system in [*systems, "greedy (sim)"]:
        rows = sorted(
            (r for r in [*results, *references] if r.system == system), key=lambda r: r.load
        )
        if not rows:
            continue
        color = colors.get(system, "black")
        xs = [r.load * 100 for r in rows]
        cap = 60_000.0  # unfinished requests: drawn at the top of the axis
        p99 = [min(r.p99_ms, cap) for r in rows]
        p50 = [min(r.p50_ms, cap) for r in rows]
        style = ":" if system == "greedy (sim)" else "-"
        ax_lat.plot(xs, p99, style, marker="o", color=color, label=f"{system} p99")
        ax_lat.plot(xs, p50, "--", marker=".", color=color, alpha=0.6, label=f"{system} p50")
        ax_tput.plot(
            xs, [r.throughput_rps for r in rows], style, marker="o", color=color, label=system
        )
    ax_lat.axhline(
        batch_time_s(1) * 1000, color="black", lw=0.8, ls=":", label="engine time, batch of 1"
    )
    ax_lat.set_yscale("log")
    ax_lat.set_xlabel("offered load (% of full-batch capacity)")
    ax_lat.set_ylabel("latency (ms, log)")
    ax_lat.set_title("Latency: p99 solid, p50 dashed")
    ax_lat.legend(fontsize=6, ncol=2)
    ax_tput.axhline(ideal, color="black", lw=0.8, ls=":", label=f"ideal {ideal:.1f} req/s")
    ax_tput.set_xlabel("offered load (% of full-batch capacity)")
    ax_tput.set_ylabel("throughput (req/s)")
    ax_tput.set_title("Throughput")
    ax_tput.legend(fontsize=7)
    fig.suptitle(
        f"Dynamic batching, scripted engine {BASE_MS:g} ms + {PER_ITEM_MS:g} ms/item, "
        f"max batch {MAX_BATCH}, wait {MAX_WAIT_MS:g} ms"
    )
    fig.tight_layout()
    path = RESULTS / "batching.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0, help="scale the arrival windows")
    parser.add_argument("--drain-s", type=float, default=DRAIN_S, help="time to drain a run")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Serve")
    parser.add_argument("--no-model", action="store_true", help="skip the local model")
    parser.add_argument(
        "--model-only",
        action="store_true",
        help="rerun only the local-model section and replace it in the existing report",
    )
    parser.add_argument("--ray-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.ray_worker:  # inside .venv-peers: run the Ray part only, write JSON
        rows = asyncio.run(run_in_process([("ray", LOADS)], args.scale, args.drain_s))
        args.json_out.write_text(json.dumps([asdict(r) for r in rows]))
        return

    if args.model_only:
        path = RESULTS / "batching.md"
        head = path.read_text().split(MODEL_HEADING)[0]
        lines = asyncio.run(model_section())
        stamp = f"(Rerun alone with `--model-only`, {time.strftime('%Y-%m-%d %H:%M')}.)"
        path.write_text("\n".join([head + MODEL_HEADING, "", stamp, "", *lines, ""]))
        print(f"updated {path.relative_to(ROOT)}")
        return

    started = time.monotonic()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run_in_process(PLAN, args.scale, args.drain_s))
    if args.no_ray:
        ray_note = "skipped (--no-ray)"
    else:
        ray_rows, ray_note = run_ray(args.scale, args.drain_s)
        results += ray_rows
        if ray_rows:
            ray_note += (
                ", `@serve.batch` queue run in-process without a deployment (its constructor's "
                "replica-context check, which only logs a `max_ongoing_requests` warning, is "
                "patched out)"
            )
        else:
            ray_note = "not measured: " + ray_note
    references = [greedy_reference(load, DURATION_S[load] * args.scale) for load in LOADS]
    model_lines = ["Skipped (--no-model)."] if args.no_model else asyncio.run(model_section())
    report = write_report(
        results, references, ray_note, model_lines, args, time.monotonic() - started
    )
    figure = plot(results, references)
    print(f"wrote {report.relative_to(ROOT)} and {figure.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
