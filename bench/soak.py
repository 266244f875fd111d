"""Soak and overload: 20,000 submits at twice what the workers can do.

Run with ``make soak`` (``.venv/bin/python bench/soak.py``); writes
``bench/results/soak.md``.

Over its own ``redis-server`` (a free loopback port; never the machine's shared Redis)
the script starts one ``ponder api`` and ``--workers`` ``ponder worker`` processes with the
scripted engine (a batched-accelerator latency model), then:

1. **Capacity.** Fills the backlog (``PONDER_MAX_PENDING``, 500) with tasks of the run's
   mix and times how fast the workers drain it: tasks per second, from the backlog's
   90 % mark to its 10 % mark (read from Redis' pending counter).
2. **Overload.** Submits ``--tasks`` (20,000) tasks open-loop at ``--load`` (2.0) times
   that capacity, never retrying: submits that find the backlog full must get 503
   ``queue_full`` with ``Retry-After``; the accepted ones must all end. Every submit's
   latency is measured at the client; the RSS of the API and worker processes is sampled
   every second.
3. **Drain.** Waits until every accepted task has ended, then audits from Redis: status
   of each accepted task, no record stored for a refused submit, queue streams empty.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis.asyncio as aioredis

from harness import (
    TERMINAL,
    own_cluster,
    parse_cluster_args,
    percentile,
    report_head,
    write_report,
)

PREFIX = "soak"
MAX_IN_FLIGHT = 100


@dataclass
class Submit:
    at: float  # seconds since the phase began (scheduled)
    latency_s: float
    status: int
    code: str
    retry_after: str | None
    task_id: str | None
    lag_s: float = 0.0  # how late the request left, against its schedule


@dataclass
class RssSeries:
    procs: dict[str, psutil.Process]
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def take(self, t: float) -> None:
        row = {}
        for name, p in self.procs.items():
            with contextlib.suppress(psutil.Error):
                row[name] = p.memory_info().rss
        self.samples.append((t, row))

    def at_fraction(self, frac: float, until: float) -> dict[str, int]:
        """The sample nearest ``frac`` of the way to ``until`` seconds."""
        target = frac * until
        return min(self.samples, key=lambda s: abs(s[0] - target))[1]


def task_body(i: int, rng: random.Random) -> dict[str, Any]:
    mode = "fast" if rng.random() < 0.8 else "standard"
    answers = ", ".join(str(rng.choice([1, 1, 2])) for _ in range(3))
    return {
        "prompt": f"soak task {i} [[answers: {answers}]]",
        "mode": mode,
        "task_type": "text",
        "priority": rng.randint(0, 5),
    }


async def wait_up(url: str, timeout_s: float = 60) -> None:
    """Until the API answers /healthz."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get("/healthz")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API did not answer within {timeout_s} s")
            await asyncio.sleep(0.1)


async def pending_total(r: aioredis.Redis) -> int:
    return int(await r.hget(f"{PREFIX}:pending", "total") or 0)


async def measure_capacity(
    c: httpx.AsyncClient,
    r: aioredis.Redis,
    rng: random.Random,
    backlog: int,
    start_workers: Callable[[], Awaitable[None]],
) -> tuple[float, list[str]]:
    """Fill the backlog before any worker runs, start the workers, time the drain from
    the 90 % mark to the 10 % mark: tasks per second."""
    gate = asyncio.Semaphore(16)

    async def submit(i: int) -> httpx.Response:
        async with gate:
            return await c.post("/v1/tasks", json=task_body(-i, rng))

    responses = await asyncio.gather(*(submit(i) for i in range(1, backlog + 1)))
    ids = [resp.json()["id"] for resp in responses if resp.status_code == 202]
    if len(ids) < backlog:
        codes = Counter(f"{resp.status_code} {resp.text[:80]}" for resp in responses)
        raise RuntimeError(f"the backlog did not fill: {codes}")
    await start_workers()
    high, low = int(len(ids) * 0.9), int(len(ids) * 0.1)
    t_high = t_low = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        n = await pending_total(r)
        now = time.monotonic()
        if t_high is None and n <= high:
            t_high = now
        if t_high is not None and n <= low:
            t_low = now
            break
        await asyncio.sleep(0.05)
    if t_high is None or t_low is None or t_low <= t_high:
        raise RuntimeError("could not time the backlog's drain")
    # the tasks claimed between the marks: in-flight ones end at the same pace
    return (high - low) / (t_low - t_high), ids


async def overload(
    c: httpx.AsyncClient, rng: random.Random, tasks: int, rate: float, rss: RssSeries
) -> tuple[list[Submit], float, float]:
    """Open-loop submits at ``rate``/s, no retries. Returns the submits, the phase's
    length and the driver's worst lag behind the schedule."""
    results: list[Submit] = []
    jobs: list[asyncio.Task[None]] = []
    t0 = time.monotonic()
    worst_lag = 0.0
    # Requests in flight at most: more would queue inside httpx's pool, whose cost grows
    # with the queue and would make the driver, not the service, the bottleneck.
    in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(i: int, at: float) -> None:
        async with in_flight:
            await send(i, at)

    async def send(i: int, at: float) -> None:
        start = time.monotonic()
        lag = start - (t0 + at)
        try:
            resp = await c.post("/v1/tasks", json=task_body(i, rng))
        except httpx.HTTPError as e:
            results.append(
                Submit(at, time.monotonic() - start, 0, type(e).__name__, None, None, lag)
            )
            return
        latency = time.monotonic() - start
        code = ""
        task_id = None
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = resp.json()
            code = body["error"]["code"] if resp.status_code >= 400 else ""
            task_id = body["id"] if resp.status_code == 202 else None
        results.append(
            Submit(
                at, latency, resp.status_code, code, resp.headers.get("retry-after"), task_id, lag
            )
        )

    async def sample_rss() -> None:
        while True:
            rss.take(time.monotonic() - t0)
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_rss())
    try:
        for i in range(tasks):
            at = i / rate
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                worst_lag = max(worst_lag, -delay)
            jobs.append(asyncio.create_task(one(i, at)))
        await asyncio.gather(*jobs)
        rss.take(time.monotonic() - t0)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return results, time.monotonic() - t0, worst_lag


async def drain(r: aioredis.Redis, ids: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Wait until every task in ``ids`` is terminal (read from Redis); their statuses."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, str] = {}
    open_ids = list(ids)
    while True:
        for start in range(0, len(open_ids), 1000):
            chunk = open_ids[start : start + 1000]
            async with r.pipeline(transaction=False) as pipe:
                for task_id in chunk:
                    pipe.hget(f"{PREFIX}:task:{task_id}", "status")
                got: list[Any] = await pipe.execute()
            status.update({i: s or "missing" for i, s in zip(chunk, got, strict=True)})
        open_ids = [i for i in open_ids if status[i] not in TERMINAL]
        if not open_ids or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.5)


async def count_task_records(r: aioredis.Redis) -> int:
    n = 0
    async for _ in r.scan_iter(match=f"{PREFIX}:task:*", count=1000):
        n += 1
    return n


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def ms(s: float) -> str:
    return f"{s * 1000:.1f}"


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    load_start = os.getloadavg()[0]
    async with own_cluster(PREFIX, args.keep_logs) as cluster:
        url = cluster.url
        worker_settings = {
            "scripted_step_ms": args.step_ms,
            "batch_max_size": 8,
            "claim_block_ms": 500,
        }
        api = cluster.api(max_pending=args.max_pending)
        workers = [cluster.worker(f"w{n}", **worker_settings) for n in range(1, args.workers + 1)]
        r = aioredis.Redis.from_url(cluster.redis.url, decode_responses=True)
        try:
            await api.start()
            await wait_up(url)

            async def start_workers() -> None:
                for w in workers:
                    await w.start()

            limits = httpx.Limits(
                max_connections=MAX_IN_FLIGHT + 20, max_keepalive_connections=MAX_IN_FLIGHT + 20
            )
            async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
                print("measuring capacity ...")
                capacity, warmup_ids = await measure_capacity(
                    c, r, rng, args.max_pending, start_workers
                )
                await drain(r, warmup_ids, 120)
                await cluster.ready(args.workers)
                rss = RssSeries({"api": psutil.Process(api.pid)})
                rss.procs.update({w.name: psutil.Process(w.pid) for w in workers})
                rate = capacity * args.load
                print(f"capacity {capacity:.1f} tasks/s; offering {args.tasks} at {rate:.1f}/s")
                rss_before = {n: p.memory_info().rss for n, p in rss.procs.items()}
                submits, phase_s, lag = await overload(c, rng, args.tasks, rate, rss)
                accepted = [s.task_id for s in submits if s.task_id]
                print(f"{len(accepted)} accepted in {phase_s:.0f} s; draining ...")
                t_drain = time.monotonic()
                final = await drain(r, accepted, args.drain_timeout_s)
                drain_s = time.monotonic() - t_drain
                rss.take(phase_s + drain_s)
                rss_after = {n: p.memory_info().rss for n, p in rss.procs.items()}
            records = await count_task_records(r)
            queues = {p: await r.xlen(f"{PREFIX}:q:{p}") for p in range(6)}
            used_memory = (await r.info("memory"))["used_memory"]
            version = await cluster.redis.version()
            load = (load_start, os.getloadavg()[0])
        finally:
            codes = {w.name: await w.stop(timeout_s=30) for w in workers}
            codes["api"] = await api.stop(timeout_s=30)
            await r.aclose()
    report = render(
        args, capacity, rate, submits, phase_s, lag, final, drain_s, rss, rss_before,
        rss_after, records, len(warmup_ids), queues, used_memory, codes, version, load,
    )  # fmt: skip
    out = Path(args.out)
    await asyncio.to_thread(write_report, out, report)
    print(report)
    print(f"wrote {out}")
    return 0 if passed(submits, final, records, len(warmup_ids)) else 1


def passed(submits: list[Submit], final: dict[str, str], records: int, warmup: int) -> bool:
    refused = [s for s in submits if s.status == 503]
    return (
        all(s.status in (202, 503) for s in submits)
        and all(s.code == "queue_full" and s.retry_after for s in refused)
        and all(v in TERMINAL for v in final.values())
        and records == warmup + len(final)
    )


WINDOW_S = 30.0


def window_rows(submits: list[Submit], rss: RssSeries, phase_s: float) -> list[str]:
    rows = []
    start = 0.0
    while start < phase_s:
        end = start + WINDOW_S
        part = [s for s in submits if start <= s.at < end]
        if part:
            lat = [s.latency_s for s in part]
            mem = min(rss.samples, key=lambda sample: abs(sample[0] - min(end, phase_s)))[1]
            rows.append(
                f"| {start:.0f}-{min(end, phase_s):.0f} | {len(part)} | "
                f"{sum(1 for s in part if s.status == 202)} | {ms(percentile(lat, 50))} | "
                f"{ms(percentile(lat, 99))} | {ms(max(lat))} | "
                f"{ms(max(max(0.0, s.lag_s) for s in part))} | "
                + " | ".join(mib(mem.get(name)) for name in rss.procs)
                + " |"
            )
        start = end
    return rows


def render(
    args: argparse.Namespace,
    capacity: float,
    rate: float,
    submits: list[Submit],
    phase_s: float,
    lag: float,
    final: dict[str, str],
    drain_s: float,
    rss: RssSeries,
    rss_before: dict[str, int],
    rss_after: dict[str, int],
    records: int,
    warmup: int,
    queues: dict[int, int],
    used_memory: int,
    codes: dict[str, int | None],
    redis_ver: str,
    load: tuple[float, float],
) -> str:
    accepted = [s for s in submits if s.status == 202]
    refused = [s for s in submits if s.status == 503]
    answers = Counter(f"{s.status} {s.code}".strip() for s in submits)
    by_status = Counter(final.values())
    stuck = sum(1 for v in final.values() if v not in TERMINAL)
    all_lat = [s.latency_s for s in submits]
    half = phase_s / 2
    steady = sum(1 for s in accepted if s.at >= half) / half
    lags = [max(0.0, s.lag_s) for s in submits] or [0.0]
    del lag  # the scheduler's own lag is covered by the per-request lags
    quarter = rss.at_fraction(0.25, phase_s)
    end_of_overload = rss.at_fraction(1.0, phase_s)
    ok = passed(submits, final, records, warmup)
    with_retry_after = sum(1 for s in refused if s.retry_after)

    def lat_row(name: str, rows: list[Submit]) -> str:
        v = [s.latency_s for s in rows]
        return (
            f"| {name} | {len(v)} | {ms(percentile(v, 50))} | {ms(percentile(v, 99))} | "
            f"{ms(max(v) if v else float('nan'))} |"
        )

    lines = [
        "# Soak and overload",
        "",
        report_head(
            "`make soak` (`.venv/bin/python bench/soak.py`)",
            args.commit,
            f"seed {args.seed}",
            redis_ver,
            load,
        ),
        "",
        f"Verdict: **{'PASS' if ok else 'FAIL'}**.",
        "",
        "## Setup",
        "",
        f"- Own `redis-server` (free loopback port), 1 `ponder api` + {args.workers} "
        "`ponder worker` processes (one worker loop each, 32 tasks in flight per loop), "
        f"scripted engine with `{args.step_ms}` ms per step (base, per row), up to 16 "
        "rows per step.",
        f"- Task mix: 80 % `fast` (1 sample), 20 % `standard` (3 samples), priorities 0..5. "
        f"Backlog limit `PONDER_MAX_PENDING={args.max_pending}`.",
        f"- **Capacity** measured first (a backlog of {args.max_pending} tasks submitted "
        "before the workers start, drained from its 90 % mark to its 10 % mark): "
        f"**{capacity:.1f} tasks/s**.",
        f"- **Overload**: {args.tasks} submits, open loop, at {args.load:g} x capacity = "
        f"**{rate:.1f}/s**, never retried; it took {phase_s:.0f} s "
        f"({len(submits) / phase_s:.1f} submits/s sent). The driver, on the same machine, "
        f"sent a request {ms(percentile(lags, 50))} ms (p50) / {ms(percentile(lags, 99))} ms "
        f"(p99) / {ms(max(lags))} ms (max) after its scheduled time (at most "
        f"{MAX_IN_FLIGHT} in flight).",
        "",
        "## Results",
        "",
        "| figure | value |",
        "|---|---|",
        f"| submits | {len(submits)} |",
        f"| accepted (202) | {len(accepted)} |",
        f"| refused 503 `queue_full` | {len(refused)} (with `Retry-After`: {with_retry_after}) |",
        "| answers | " + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())) + " |",
        f"| accepted tasks ended | {sum(by_status[s] for s in TERMINAL)} of {len(final)} |",
        *(f"| ended `{s}` | {by_status[s]} |" for s in ("done", "partial_done", "failed")),
        f"| stuck after the drain | **{stuck}** {'✅' if stuck == 0 else '❌'} |",
        f"| task records in Redis | {records} = {warmup} (capacity phase) + "
        f"{records - warmup} (overload): refused submits stored nothing |",
        f"| admissions in the second half of the overload (the workers' pace once the "
        f"backlog is full) | {steady:.1f} tasks/s |",
        f"| drain after the last submit | {drain_s:.1f} s |",
        "| queue streams after the drain (XLEN 0..5) | "
        + ", ".join(str(queues[p]) for p in range(6))
        + " |",
        f"| Redis used_memory after the run | {mib(used_memory)} MiB (task records are kept "
        "for `PONDER_TASK_TTL_S`) |",
        "",
        "### Submit latency (client side, ms)",
        "",
        "| submits | n | p50 | p99 | max |",
        "|---|---|---|---|---|",
        lat_row("all", submits),
        lat_row("accepted (202)", accepted),
        lat_row("refused (503)", refused),
        "",
        f"p99 over all submits: **{ms(percentile(all_lat, 99))} ms**.",
        "",
        "### Over time",
        "",
        f"Per {WINDOW_S:g} s of the overload (by scheduled send time): submits, accepted, "
        "latency, the driver's worst lag, and the RSS of each process at the window's end.",
        "",
        "| window (s) | submits | accepted | p50 ms | p99 ms | max ms | worst lag ms | "
        + " | ".join(f"{name} MiB" for name in rss.procs)
        + " |",
        "|---" * (7 + len(rss.procs)) + "|",
        *window_rows(submits, rss, phase_s),
        "",
        "### Memory (RSS, MiB)",
        "",
        "| process | after capacity phase | 25 % into overload | end of overload | "
        "after drain | growth 25 % → end |",
        "|---|---|---|---|---|---|",
    ]
    for name in rss.procs:
        q, e = quarter.get(name), end_of_overload.get(name)
        growth = f"{(e - q) / q:+.1%}" if q and e else "-"
        lines.append(
            f"| {name} | {mib(rss_before.get(name))} | {mib(q)} | {mib(e)} | "
            f"{mib(rss_after.get(name))} | {growth} |"
        )
    lines += [
        "",
        "Exit codes at the end (SIGTERM): " + ", ".join(f"{k} {v}" for k, v in codes.items()) + ".",
        "",
        "## How the figures are measured",
        "",
        "- *capacity*: the backlog filled to its limit with the run's task mix; the time "
        "the workers take to claim from its 90 % mark down to its 10 % mark (Redis' "
        "pending counter), as tasks per second.",
        "- *latency*: from the driver sending `POST /v1/tasks` to the full answer, on the "
        "same 2-core machine as everything else (the driver included).",
        "- *RSS*: `psutil` on each process every second. The 25 % mark is after warm-up "
        "(imports, pools, caches); flat means no growth with the number of tasks served.",
        "- *stuck*: an accepted task whose record is not terminal when the drain ends "
        f"(timeout {args.drain_timeout_s:g} s).",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--load", type=float, default=2.0, help="offered load / capacity")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", default="25,1", help="scripted engine: base,per_row ms a step")
    p.add_argument("--max-pending", type=int, default=500)
    p.add_argument("--drain-timeout-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    return parse_cluster_args(p, "soak.md", argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse_args())))
