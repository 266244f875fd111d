"""Benchmark: continuous batching (rows join and leave per step) against static batches.

Run with ``make bench-continuous`` (``.venv/bin/python bench/continuous.py``). Writes
``bench/results/continuous.md`` and ``bench/results/continuous.png``. One run; every ratio
in the report compares figures of that run, measured side by side (interleaved).

1. **Real model** (SmolLM2-135M, 1 engine thread): one ``OpenVINOEngine``, used
   directly (**continuous**, ponder's default) and behind today's ``DynamicBatcher``
   (**static**: whole batches of up to 8, 50 ms wait, length buckets, adaptive; each
   batch held until its slowest row ends — ``PONDER_BATCHING=static``). Rows come from a
   realistic length mix (85 %: 20-120 new tokens, 15 %: a 512-token cap; story prompts,
   so rows run to their limit) with open-loop Poisson arrivals at 50 / 90 / 150 % of the
   engine's capacity, the same arrivals for both systems. Capacity is the continuous
   engine's saturated rate, measured first (rows/s of the mix with ``max_rows`` rows
   always in flight). Reported: completion tokens/s and p50/p99 latency of short rows
   (< 120 tokens) and of all rows. Also measured: the engine's ``max_rows`` (tokens/s when
   saturated at 4, 8, 16, 32 rows), the admission wait (``max_wait_ms``) at 50 % load,
   and through the service (API + worker + embedded store): a 16-token answer submitted
   20 ms after a 600-token essay vs its solo latency.
2. **OpenAI engine** against a stand-in OpenAI-compatible server (a subprocess: every
   request served on its own after a fixed delay, up to 256 at once): 128 one-sample
   tasks through the service, completion rate vs the stand-in's, peak requests in flight.
3. **Scripted engine**, the batching benchmark's workload (``bench/batching.py``: 200 ms
   + 6.7 ms per row per step, one step per row, Poisson arrivals): throughput vs ideal for
   the static batcher and the continuous engine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

import batching  # noqa: E402  (the scripted workload and driver)
from harness import STAND_IN, free_port  # noqa: E402  (the stand-in OpenAI server)
from ponder.batcher import DynamicBatcher  # noqa: E402
from ponder.config import Settings, load_settings  # noqa: E402
from ponder.engines.base import SampleOutput, SampleRequest  # noqa: E402
from ponder.engines.scripted import ScriptedEngine  # noqa: E402
from ponder.errors import EngineBusy  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SEED = 20261201
LOADS = (0.5, 0.9, 1.5)
SHORT = 120
LONG_CAP = 512
SUBJECTS = [
    "a brave dragon", "a lost robot", "a lighthouse keeper", "a talking cat", "a desert city",
    "a clockmaker", "a deep-sea diver", "a mountain village", "a young wizard", "an old pirate",
    "a space station", "a haunted library", "a river otter", "a baker at dawn", "a storm",
    "a forgotten king", "a firefly", "a circus acrobat", "an arctic fox", "a secret garden",
]  # fmt: skip

Submit = Callable[[SampleRequest], Awaitable[SampleOutput]]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_average() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


# --- the real-model workload -----------------------------------------------------------


@dataclass(frozen=True)
class Row:
    at_s: float
    prompt: str
    max_new_tokens: int


def draw_length(rng: random.Random) -> int:
    return LONG_CAP if rng.random() < 0.15 else rng.randint(20, SHORT)


def mean_length() -> float:
    return 0.85 * (20 + SHORT) / 2 + 0.15 * LONG_CAP


def prompt_for(i: int) -> str:
    return f"Write a long, detailed story about {SUBJECTS[i % len(SUBJECTS)]} (story {i})."


def model_workload(rate_rps: float, window_s: float, seed: str) -> list[Row]:
    rng = random.Random(seed)
    rows: list[Row] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_rps)
        if t >= window_s:
            return rows
        rows.append(Row(t, prompt_for(len(rows)), draw_length(rng)))


@dataclass
class LoadResult:
    system: str
    load: float
    rows: int
    completed: int
    tokens_per_s: float
    short_p50_s: float
    short_p99_s: float
    all_p50_s: float
    all_p99_s: float
    short_rows: int
    notes: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    return batching.percentile(values, q)


async def submit_retrying(submit: Submit, request: SampleRequest) -> SampleOutput:
    delay = 0.001
    while True:
        try:
            return await submit(request)
        except EngineBusy:
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)


async def drive_model(
    system: str,
    load: float,
    rows: Sequence[Row],
    submit: Submit,
    window_s: float,
    drain_s: float,
    engine_tokens: Callable[[], int],
) -> LoadResult:
    """Open loop: each row at its time; latency from its scheduled arrival to its output.

    Throughput is the tokens the engine generated while the arrivals lasted (its own
    counter: rows still running count too), so long rows finishing in the drain do not
    distort it."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    tokens_at_start = engine_tokens()
    latency = [math.inf] * len(rows)

    async def one(i: int, row: Row) -> None:
        request = SampleRequest(prompt=row.prompt, max_new_tokens=row.max_new_tokens)
        await submit_retrying(submit, request)
        latency[i] = loop.time() - (t0 + row.at_s)

    tasks = []
    for i, row in enumerate(rows):
        delay = t0 + row.at_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, row)))
    window_end = t0 + window_s
    if window_end > loop.time():
        await asyncio.sleep(window_end - loop.time())
    rate = (engine_tokens() - tokens_at_start) / (loop.time() - t0)
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    done = [i for i in range(len(rows)) if math.isfinite(latency[i])]
    short = [latency[i] for i, r in enumerate(rows) if r.max_new_tokens < SHORT]
    return LoadResult(
        system=system,
        load=load,
        rows=len(rows),
        completed=len(done),
        tokens_per_s=rate,
        short_p50_s=percentile(short, 50),
        short_p99_s=percentile(short, 99),
        all_p50_s=percentile(latency, 50),
        all_p99_s=percentile(latency, 99),
        short_rows=len(short),
        notes=f"{len(pending)} unfinished {drain_s:g} s after the window" if pending else "",
    )


async def saturated_rate(engine: object, rows: int, seconds: float, seed: str) -> float:
    """Tokens/s with ``rows`` rows always in flight (a closed loop over the length mix)."""
    from ponder.engines.continuous import ContinuousEngine

    assert isinstance(engine, ContinuousEngine)
    rng = random.Random(seed)
    stop_at = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def lane() -> None:
        while time.monotonic() < stop_at:
            i = next(counter)
            await engine.submit(
                SampleRequest(prompt=prompt_for(i), max_new_tokens=draw_length(rng))
            )

    start_tokens, start = engine.stats.tokens, time.monotonic()
    lanes = [asyncio.create_task(lane()) for _ in range(rows)]
    await asyncio.sleep(seconds)
    measured = (engine.stats.tokens - start_tokens) / (time.monotonic() - start)
    for task in lanes:
        task.cancel()
    await asyncio.gather(*lanes, return_exceptions=True)
    for _ in range(1200):  # the cancelled rows leave at the next step
        if not engine.describe()["rows_running"] and not engine.describe()["rows_prefilling"]:
            break
        await asyncio.sleep(0.05)
    return measured


# --- through the service ---------------------------------------------------------------


class Service:
    """``ponder serve``'s API and worker runtime served by uvicorn in this process."""

    def __init__(self, settings: Settings) -> None:
        from ponder.compose import all_in_one

        service = all_in_one(settings, workers=1)
        self.app, self.runtime = service.app, service.runtime
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None
        self.url = ""

    async def __aenter__(self) -> Service:
        self.task = asyncio.create_task(self.server.serve())
        async with asyncio.timeout(300):
            while not self.server.started:
                if self.task.done():
                    self.task.result()
                await asyncio.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await asyncio.wait_for(self.task, 120)


async def run_task(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[float, dict]:
    """Submit a task, follow its event stream to the end; (seconds, final task)."""
    started = time.monotonic()
    response = await client.post("/v1/tasks", json=body)
    response.raise_for_status()
    task_id = response.json()["id"]
    async with client.stream("GET", f"/v1/tasks/{task_id}/events", timeout=600) as stream:
        async for _ in stream.aiter_lines():
            pass
    elapsed = time.monotonic() - started
    final = (await client.get(f"/v1/tasks/{task_id}")).json()
    return elapsed, final


async def essay_section(base: Settings, repeats: int) -> list[str]:
    short = {"prompt": "What is 3 + 3?", "mode": "fast", "max_new_tokens": 16}
    essay = {
        "prompt": "Write a long essay about the history of Rome, from its founding to its fall.",
        "mode": "fast",
        "max_new_tokens": 600,
    }
    lines = [
        "| batching | short task alone (median of "
        f"{repeats}) | short beside the essay | ratio | short status | essay status | essay "
        "tokens | essay time |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for batching_mode in ("static", "continuous"):
        settings = base.model_copy(update={"batching": batching_mode})
        async with Service(settings) as service, httpx.AsyncClient(base_url=service.url) as c:
            await run_task(c, short)  # warm-up
            alone = statistics.median([(await run_task(c, short))[0] for _ in range(repeats)])
            essay_job = asyncio.create_task(run_task(c, essay))
            await asyncio.sleep(0.02)
            beside, short_final = await run_task(c, short)
            essay_s, essay_final = await essay_job
        tokens = essay_final["usage"]["completion_tokens"]
        lines.append(
            f"| {batching_mode} | {alone:.2f} s | {beside:.2f} s | {beside / alone:.2f}x | "
            f"{short_final['status']} | {essay_final['status']} | {tokens} | {essay_s:.1f} s |"
        )
        log(f"essay/{batching_mode}: alone {alone:.2f}s beside {beside:.2f}s")
    return lines


# --- OpenAI engine against a stand-in server --------------------------------------------

UNPOOLED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


async def openai_section(base: Settings, tasks: int, delay_s: float) -> list[str]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STAND_IN, str(port), str(delay_s), "256",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [
        f"Stand-in: every request answered after {delay_s:g} s, up to 256 at once (capacity "
        f"{256 / delay_s:.0f} requests/s; for a burst of {tasks} one-sample tasks the best "
        f"possible completion is {tasks} tasks in {delay_s:g} s = {tasks / delay_s:.1f} "
        "tasks/s). Tasks: fast mode, submitted at once over HTTP, waited on by SSE.",
        "",
        "| settings | tasks done | time | tasks/s | vs the stand-in | peak in flight "
        "(engine / server) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    try:
        async with httpx.AsyncClient() as c, asyncio.timeout(30):
            while True:
                try:
                    await c.get(f"http://127.0.0.1:{port}/stats")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        variants = [
            ("defaults: 64 in flight, 32 tasks per worker", {}),
            ("256 in flight, 256 tasks per worker", {"openai_max_concurrency": 256,
                                                     "worker_max_tasks": 256}),
        ]  # fmt: skip
        for label, extra in variants:
            settings = base.model_copy(
                update={
                    "engine": "openai",
                    "openai_base_url": f"http://127.0.0.1:{port}/v1",
                    "openai_model": "stand-in",
                    "max_pending": 1000,
                    **extra,
                }
            )
            async with (
                Service(settings) as service,
                # every task's submit and event stream at once (httpx's default pool: 100)
                httpx.AsyncClient(base_url=service.url, timeout=60, limits=UNPOOLED) as client,
            ):
                async with httpx.AsyncClient() as raw:
                    before = (await raw.get(f"http://127.0.0.1:{port}/stats")).json()
                started = time.monotonic()
                bodies = [{"prompt": f"q{i}", "mode": "fast"} for i in range(tasks)]
                finals = await asyncio.gather(*(run_task(client, b) for b in bodies))
                elapsed = time.monotonic() - started
                engine_peak = service.runtime.engine.describe()["peak_in_flight"]
                async with httpx.AsyncClient() as raw:
                    after = (await raw.get(f"http://127.0.0.1:{port}/stats")).json()
            done = sum(f["status"] == "done" for _, f in finals)
            rate = done / elapsed
            lines.append(
                f"| {label} | {done}/{tasks} | {elapsed:.2f} s | {rate:.1f} | "
                f"{rate / (tasks / delay_s):.2f}x | {engine_peak} / {after['peak']} |"
            )
            log(f"openai/{label}: {rate:.1f} tasks/s, peak {engine_peak}")
            del before
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    return lines


# --- scripted engine: the batching benchmark's workload ---------------------------------


async def scripted_section(scale: float) -> list[LoadResult | batching.RunResult]:
    out: list[LoadResult | batching.RunResult] = []
    for load in (0.5, 0.9, 1.5):
        duration = batching.DURATION_S[load] * scale
        for system in ("ponder", "ponder-continuous"):
            arrivals = batching.workload(load, duration)
            if system == "ponder":
                out.append(await batching.run_system("ponder", load, duration, batching.DRAIN_S))
                continue
            engine = ScriptedEngine(
                step_ms=(batching.BASE_MS, batching.PER_ITEM_MS), max_rows=batching.MAX_BATCH
            )
            await engine.start()
            recording = batching.RecordingEngine(engine)

            async def submit(request: SampleRequest, _e: ScriptedEngine = engine) -> SampleOutput:
                request.prompt = f"[[tokens: 1]] {request.prompt}"
                return await _e.submit(request)

            try:
                result = await batching.drive(
                    system, load, arrivals, submit, recording, batching.DRAIN_S
                )
            finally:
                await engine.close()
            result.batches = engine.stats.steps
            result.mean_batch = engine.stats.rows_stepped / max(1, engine.stats.steps)
            out.append(result)
        log(f"scripted load {load}: done")
    return out


async def preemption_section(seconds: float) -> list[str]:
    """A flood of long priority-5 rows keeps every slot busy; short priority-1 rows arrive
    (Poisson, 2/s): their latency with and without preemption."""
    lines = [
        f"Scripted engine, 16 rows, 10 ms + 0.5 ms per row per step; 32 priority-5 rows of "
        f"200 tokens always queued (a backlog); short priority-1 rows (5 tokens) arriving "
        f"at 2/s for {seconds:g} s. Without preemption an urgent row waits for a slot "
        "(fair share admits it first, but only when a row ends).",
        "",
        "| preemption | urgent rows | urgent p50 | urgent p99 | background tokens/s | preempted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for after_ms in (0.0, 100.0):
        engine = ScriptedEngine(step_ms=(10, 0.5), max_rows=16, preempt_after_ms=after_ms)
        await engine.start()
        stop = asyncio.Event()

        async def background(_e: ScriptedEngine = engine, _stop: asyncio.Event = stop) -> None:
            while not _stop.is_set():
                await _e.submit(SampleRequest(prompt="[[tokens: 200]]", priority=5))

        lanes = [asyncio.create_task(background()) for _ in range(48)]
        rng = random.Random(f"{SEED}:preempt")
        latencies: list[float] = []

        async def urgent(_e: ScriptedEngine = engine, _out: list[float] = latencies) -> None:
            start = time.monotonic()
            await _e.submit(SampleRequest(prompt="[[tokens: 5]]", priority=1))
            _out.append(time.monotonic() - start)

        await asyncio.sleep(2.0)  # the backlog fills every slot
        tokens_before, t0 = engine.stats.tokens, time.monotonic()
        jobs = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.expovariate(2.0))
            jobs.append(asyncio.create_task(urgent()))
        await asyncio.gather(*jobs)
        rate = (engine.stats.tokens - tokens_before) / (time.monotonic() - t0)
        stop.set()
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        await engine.close()
        label = "off" if not after_ms else f"after {after_ms:g} ms"
        lines.append(
            f"| {label} | {len(latencies)} | {percentile(latencies, 50):.2f} s | "
            f"{percentile(latencies, 99):.2f} s | {rate:.0f} | {engine.stats.preempted} |"
        )
        log(f"preemption {label}: p99 {percentile(latencies, 99):.2f}s")
    return lines


# --- the run ---------------------------------------------------------------------------


@dataclass
class ModelFigures:
    capacity_rps: float = math.nan
    capacity_tokens_s: float = math.nan
    max_rows: list[tuple[int, float]] = field(default_factory=list)
    loads: list[LoadResult] = field(default_factory=list)
    wait: list[LoadResult] = field(default_factory=list)


async def model_section(args: argparse.Namespace, settings: Settings) -> ModelFigures:
    from ponder.engines.openvino import OpenVINOEngine

    figures = ModelFigures()
    engine = OpenVINOEngine(settings)
    await engine.start()
    try:
        await engine.submit(SampleRequest(prompt=prompt_for(0), max_new_tokens=8))  # warm-up
        for rows in args.max_rows:
            engine.max_rows = rows
            rate = await saturated_rate(engine, rows, args.saturate_s, f"{SEED}:rows{rows}")
            figures.max_rows.append((rows, rate))
            log(f"max_rows {rows}: {rate:.1f} tokens/s")
        engine.max_rows = settings.engine_max_rows
        figures.capacity_tokens_s = dict(figures.max_rows).get(settings.engine_max_rows) or (
            await saturated_rate(engine, settings.engine_max_rows, args.saturate_s, f"{SEED}:cap")
        )
        figures.capacity_rps = figures.capacity_tokens_s / mean_length()
        log(f"capacity {figures.capacity_rps:.3f} rows/s ({figures.capacity_tokens_s:.1f} tok/s)")
        batcher = DynamicBatcher.from_settings(engine, settings)
        await batcher.start()

        def counter() -> int:
            return engine.stats.tokens

        try:
            for n, load in enumerate(LOADS):
                rows = model_workload(
                    load * figures.capacity_rps, args.window_s, f"{SEED}:load{load}"
                )
                systems: list[tuple[str, Submit]] = [
                    ("static", batcher.submit),
                    ("continuous", engine.submit),
                ]
                if n % 2:
                    systems.reverse()  # alternate who goes first
                for name, submit in systems:
                    result = await drive_model(
                        name, load, rows, submit, args.window_s, args.drain_s, counter
                    )
                    figures.loads.append(result)
                    log(f"{name} @ {load:.0%}: {result.tokens_per_s:.1f} tok/s, short p99 "
                        f"{result.short_p99_s:.1f} s ({load_average()})")  # fmt: skip
            rows = model_workload(0.5 * figures.capacity_rps, args.window_s, f"{SEED}:wait")
            for wait_ms in (0.0, 50.0):
                engine.max_wait_s = wait_ms / 1000
                result = await drive_model(
                    f"continuous, max_wait_ms={wait_ms:g}",
                    0.5,
                    rows,
                    engine.submit,
                    args.window_s,
                    args.drain_s,
                    counter,
                )
                figures.wait.append(result)
                log(f"wait {wait_ms}: short p50 {result.short_p50_s:.2f}s")
            engine.max_wait_s = settings.engine_max_wait_ms / 1000
        finally:
            await batcher.close()
    finally:
        await engine.close()
    return figures


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs``, saying so when a side has unfinished rows (infinitely slow)."""
    if not math.isfinite(theirs):
        return "static unfinished" if not math.isfinite(ours) else "finite vs static unfinished"
    if not math.isfinite(ours):
        return "continuous unfinished"
    return f"{ours / theirs:.2f}x"


def fmt(seconds: float) -> str:
    return "unfinished" if not math.isfinite(seconds) else f"{seconds:.2f} s"


def write_report(
    args: argparse.Namespace,
    figures: ModelFigures | None,
    essay: list[str],
    openai: list[str],
    scripted: list[LoadResult | batching.RunResult],
    preemption: list[str],
    started_load: str,
    elapsed_s: float,
) -> Path:
    lines = [
        "# Continuous batching vs static batches",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'bench/continuous.py', *sys.argv[1:]])}` "
        f"(`make bench-continuous`). Date: {time.strftime('%Y-%m-%d %H:%M %Z')}. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}. Load average at the start: {started_load}; at the end: "
        f"{load_average()}. Took {elapsed_s / 60:.1f} min. One run; each ratio compares "
        "figures of this run, the systems interleaved.",
        "",
    ]
    if figures is not None:
        lines += [
            "## Real model (SmolLM2-135M, 1 torch thread)",
            "",
            f"Length mix: 85 % of rows 20-{SHORT} new tokens, 15 % {LONG_CAP} (mean "
            f"{mean_length():.0f}); story prompts; greedy. Capacity (continuous, "
            f"{args.default_rows} rows in flight): {figures.capacity_tokens_s:.1f} tokens/s = "
            f"{figures.capacity_rps:.3f} rows/s of the mix. Arrival windows of "
            f"{args.window_s:g} s, then up to {args.drain_s:g} s to finish (unfinished rows "
            "count as infinitely slow). Short rows: under 120 tokens. Tokens/s: what the "
            "engine generated during the arrival window (its own counter, rows still running "
            "included).",
            "",
            "| load | system | rows | done | tokens/s | short p50 | short p99 | all p50 | "
            "all p99 | notes |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        by = {(r.system, r.load): r for r in figures.loads}
        for r in figures.loads:
            lines.append(
                f"| {r.load:.0%} | {r.system} | {r.rows} | {r.completed} | {r.tokens_per_s:.1f} "
                f"| {fmt(r.short_p50_s)} | {fmt(r.short_p99_s)} | {fmt(r.all_p50_s)} | "
                f"{fmt(r.all_p99_s)} | {r.notes} |"
            )
        lines += ["", "Ratios (continuous / static), this run:", ""]
        for load in LOADS:
            s, c = by.get(("static", load)), by.get(("continuous", load))
            if s and c and s.tokens_per_s > 0:
                lines.append(
                    f"- {load:.0%}: throughput {c.tokens_per_s / s.tokens_per_s:.2f}x; short-row "
                    f"p99 {ratio(c.short_p99_s, s.short_p99_s)}; short-row p50 "
                    f"{ratio(c.short_p50_s, s.short_p50_s)}"
                )
        s, c = by.get(("static", 1.5)), by.get(("continuous", 1.5))
        goal1 = c is not None and s is not None and c.tokens_per_s >= 1.5 * s.tokens_per_s
        s9, c9 = by.get(("static", 0.9)), by.get(("continuous", 0.9))
        goal2 = c9 is not None and s9 is not None and c9.short_p99_s <= 0.5 * s9.short_p99_s
        lines += [
            "",
            f"- Goal: continuous ≥ 1.5 x static throughput at 150 %: "
            f"**{'met' if goal1 else 'not met'}**.",
            f"- Goal: p99 of rows under 120 tokens at 90 % ≤ 0.5 x static: "
            f"**{'met' if goal2 else 'not met'}**.",
            "",
            "### Rows in flight (`PONDER_ENGINE_MAX_ROWS`)",
            "",
            f"Saturated throughput of the length mix, {args.saturate_s:g} s each:",
            "",
            "| max rows | tokens/s |",
            "|---:|---:|",
            *[f"| {rows} | {rate:.1f} |" for rows, rate in figures.max_rows],
            "",
            "### The admission wait (`PONDER_ENGINE_MAX_WAIT_MS`) at 50 % load",
            "",
            "| setting | tokens/s | short p50 | short p99 | all p50 |",
            "|---|---:|---:|---:|---:|",
            *[
                f"| {r.system} | {r.tokens_per_s:.1f} | {fmt(r.short_p50_s)} | "
                f"{fmt(r.short_p99_s)} | {fmt(r.all_p50_s)} |"
                for r in figures.wait
            ],
            "",
        ]
    if essay:
        lines += [
            "### A 16-token answer beside a 600-token essay (through the service)",
            "",
            "Both `fast` tasks over HTTP (`ponder serve`'s app in-process, embedded store); "
            'the short one ("What is 3 + 3?", `max_new_tokens` 16) submitted 20 ms after '
            "the essay. Goal: ≤ 2 x its solo latency, both `done`.",
            "",
            *essay,
            "",
        ]
    if openai:
        lines += ["## OpenAI engine against a stand-in server", "", *openai, ""]
    if preemption:
        lines += ["## Preemption (`PONDER_ENGINE_PREEMPT_AFTER_MS`)", "", *preemption, ""]
    if scripted:
        ideal = batching.capacity_rps()
        lines += [
            "## Scripted engine: the batching benchmark's workload",
            "",
            f"`bench/batching.py`'s arrivals and latency model ({batching.BASE_MS:g} ms + "
            f"{batching.PER_ITEM_MS:g} ms per row per step, at most {batching.MAX_BATCH} rows; "
            f"ideal {ideal:.1f} requests/s). **ponder** = the static `DynamicBatcher` (as in "
            "`bench/results/batching.md`); **ponder-continuous** = the continuous "
            "`ScriptedEngine` (each row one step).",
            "",
            "| load | system | requests | throughput (req/s) | vs ideal | p50 | p99 |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in scripted:
            assert isinstance(r, batching.RunResult)
            lines.append(
                f"| {r.load:.0%} | {r.system} | {r.requests} | {r.throughput_rps:.2f} | "
                f"{r.throughput_rps / ideal:.3f} | {r.p50_ms:.0f} ms | {r.p99_ms:.0f} ms |"
            )
        lines.append("")
    path: Path = args.out.resolve()
    path.write_text("\n".join(lines))
    return path


def plot(figures: ModelFigures) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for k, system in enumerate(("static", "continuous")):
        rows = [r for r in figures.loads if r.system == system]
        xs = [LOADS.index(r.load) + (k - 0.5) * width for r in rows]
        ax1.bar(xs, [r.tokens_per_s for r in rows], width, label=system)
        ax2.bar(
            xs,
            [r.short_p99_s if math.isfinite(r.short_p99_s) else 0 for r in rows],
            width,
            label=system,
        )
    for ax, title in ((ax1, "completion tokens/s"), (ax2, "p99 latency of short rows (s)")):
        ax.set_xticks(range(len(LOADS)), [f"{load:.0%} load" for load in LOADS])
        ax.set_title(title)
        ax.legend()
    fig.suptitle("SmolLM2-135M, 1 thread: continuous vs static batching")
    fig.tight_layout()
    path = RESULTS / "continuous.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--window-s", type=float, default=150.0, help="arrival window per load")
    parser.add_argument("--drain-s", type=float, default=100.0, help="time to finish a run")
    parser.add_argument("--saturate-s", type=float, default=40.0, help="each saturation run")
    parser.add_argument("--max-rows", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--essay-repeats", type=int, default=3)
    parser.add_argument("--openai-tasks", type=int, default=128)
    parser.add_argument("--openai-delay-s", type=float, default=2.0)
    parser.add_argument("--scripted-scale", type=float, default=1.0)
    parser.add_argument("--preempt-s", type=float, default=30.0, help="urgent arrivals window")
    sections = ["model", "essay", "openai", "scripted", "preemption"]
    parser.add_argument("--skip", nargs="*", default=[], choices=sections)
    parser.add_argument("--out", type=Path, default=RESULTS / "continuous.md", help="the report")
    args = parser.parse_args()
    started, started_load = time.monotonic(), load_average()
    log(f"load average {started_load}")
    settings = load_settings(engine="openvino", engine_threads=1, redis_url=None,
                             sqlite_path=str(ROOT / ".bench-continuous.db"))  # fmt: skip
    args.default_rows = settings.engine_max_rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    figures = None if "model" in args.skip else asyncio.run(model_section(args, settings))
    essay = [] if "essay" in args.skip else asyncio.run(essay_section(settings, args.essay_repeats))
    openai = (
        []
        if "openai" in args.skip
        else asyncio.run(openai_section(settings, args.openai_tasks, args.openai_delay_s))
    )
    scripted = [] if "scripted" in args.skip else asyncio.run(scripted_section(args.scripted_scale))
    preemption = (
        [] if "preemption" in args.skip else asyncio.run(preemption_section(args.preempt_s))
    )
    for suffix in ("", "-wal", "-shm"):
        Path(f"{settings.sqlite_path}{suffix}").unlink(missing_ok=True)
    report = write_report(
        args,
        figures,
        essay,
        openai,
        scripted,
        preemption,
        started_load,
        time.monotonic() - started,
    )
    figure = plot(figures) if figures is not None else None
    print(
        f"wrote {report.relative_to(ROOT)}" + (f" and {figure.relative_to(ROOT)}" if figure else "")
    )


if __name__ == "__main__":
    main()
