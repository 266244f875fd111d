"""Batch API under interactive load: does a big batch leave interactive traffic its share?

Run with ``make bench-batch`` (``.venv/bin/python bench/batch.py``); writes
``bench/results/batch.md``.

Over its own ``redis-server`` (a free loopback port; never the machine's shared Redis)
the script starts one ``ponder api`` and one ``ponder worker`` with the scripted engine
(``--step-ms``: a batched-accelerator latency model, base + per row per decode step;
rows join and leave the running batch at every step),
then:

1. **Capacity.** Submits ``--capacity-tasks`` fast tasks at once and measures how fast
   the worker finishes them (tasks/s, from the first start to the last end).
2. **Interactive alone.** Fast tasks (priority 3) arrive open loop (Poisson) at
   ``--load`` (0.5) times that capacity for ``--baseline-s`` seconds; each task's latency
   is its ``finished_at - created_at`` (server clock: no client overhead).
3. **Interactive + batch.** Uploads a ``--lines`` (2,000) line batch of fast chat
   completions (``files.create`` + ``batches.create`` with the official SDK) and runs the
   same interactive load until the batch has completed. The batch's lines run at
   ``PONDER_BATCH_PRIORITY`` (5), admitted by the feeder.

The report compares the interactive p50 / p99 with and without the batch (goal: p99 at
most 1.5 x) and gives the batch's throughput (lines/s from ``in_progress_at`` to
``completed_at``) and how many interactive submits were refused (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from openai import AsyncOpenAI

from harness import (
    TERMINAL,
    own_cluster,
    parse_cluster_args,
    percentile,
    report_head,
    write_report,
)

PREFIX = "batchbench"
MAX_IN_FLIGHT = 200  # interactive submits in flight at once (the driver's own bound)


@dataclass
class Phase:
    name: str
    rate: float
    submitted: int = 0
    refused: int = 0
    ids: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def row(self) -> str:
        p50, p99 = percentile(self.latencies_s, 50), percentile(self.latencies_s, 99)
        top = max(self.latencies_s, default=float("nan"))
        return (
            f"| {self.name} | {self.submitted} in {self.seconds:.0f} s ({self.rate:.1f}/s) | "
            f"{len(self.latencies_s)} | {p50 * 1000:.0f} ms | {p99 * 1000:.0f} ms | "
            f"{top * 1000:.0f} ms | {self.refused} |"
        )


def fast_task(i: int) -> dict[str, Any]:
    return {"prompt": f"interactive {i} [[answers: 1]]", "mode": "fast", "task_type": "text"}


def seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


async def settle(
    c: httpx.AsyncClient, ids: Sequence[str], timeout_s: float
) -> list[dict[str, Any]]:
    """Every task of ``ids`` once it has ended (read again every half second)."""
    left, ended = set(ids), []
    deadline = time.monotonic() + timeout_s
    while left:
        for task_id in sorted(left):
            task = (await c.get(f"/v1/tasks/{task_id}")).json()
            if task["status"] in TERMINAL:
                ended.append(task)
                left.discard(task_id)
        if left:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(left)} tasks did not end within {timeout_s} s")
            await asyncio.sleep(0.5)
    return ended


async def measure_capacity(c: httpx.AsyncClient, count: int) -> float:
    """Fast tasks per second the worker finishes with a full backlog."""
    ids = []
    for i in range(count):
        r = await c.post("/v1/tasks", json=fast_task(-i))
        r.raise_for_status()
        ids.append(r.json()["id"])
    tasks = await settle(c, ids, timeout_s=600)
    first = min(t["started_at"] for t in tasks)
    last = max(t["finished_at"] for t in tasks)
    return count / seconds_between(first, last)


async def interactive(c: httpx.AsyncClient, phase: Phase, until: asyncio.Event | float,
                      rng: random.Random) -> None:  # fmt: skip
    """Open-loop Poisson arrivals at ``phase.rate`` until the event is set (or for that
    many seconds)."""
    started = time.monotonic()
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    jobs: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        async with gate:
            r = await c.post("/v1/tasks", json=fast_task(i))
        if r.status_code == 202:
            phase.ids.append(r.json()["id"])
        else:
            phase.refused += 1

    due = started
    while True:
        if isinstance(until, asyncio.Event) and until.is_set():
            break
        if isinstance(until, float) and time.monotonic() - started >= until:
            break
        due += rng.expovariate(phase.rate)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        job = asyncio.create_task(one(phase.submitted))
        jobs.add(job)
        job.add_done_callback(jobs.discard)
        phase.submitted += 1
    await asyncio.gather(*jobs)
    phase.seconds = time.monotonic() - started
    ended = await settle(c, phase.ids, timeout_s=600)
    phase.latencies_s = [
        seconds_between(t["created_at"], t["finished_at"]) for t in ended if t["status"] == "done"
    ]


def batch_file(lines: int) -> bytes:
    rows = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "ponder-fast", "messages": [{"role": "user",
                                                        "content": f"[[answers: {i}]]"}]}}
        for i in range(lines)
    ]  # fmt: skip
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


async def run_batch(sdk: AsyncOpenAI, lines: int, done: asyncio.Event) -> Any:
    """Upload and run the batch; the batch as it ended."""
    try:
        file = await sdk.files.create(file=("batch.jsonl", batch_file(lines)), purpose="batch")
        batch = await sdk.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            await asyncio.sleep(0.5)
            batch = await sdk.batches.retrieve(batch.id)
        return batch
    finally:
        done.set()


async def main(args: argparse.Namespace) -> int:
    load_start = os.getloadavg()[0]
    rng = random.Random(args.seed)
    async with own_cluster(PREFIX, args.keep_logs) as cluster:
        settings = {
            "scripted_step_ms": args.step_ms,
            "engine_max_rows": args.max_rows,
            "max_pending": args.max_pending,
            "batch_max_in_flight": args.in_flight,
        }
        api = cluster.api(**settings)
        worker = cluster.worker("w1", **settings)
        url = cluster.url
        try:
            await api.start()
            await worker.start()
            await cluster.ready(1)
            async with (
                httpx.AsyncClient(base_url=url, timeout=30) as c,
                AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=2) as sdk,
            ):
                capacity = await measure_capacity(c, args.capacity_tasks)
                rate = args.load * capacity
                print(f"capacity {capacity:.1f} tasks/s; interactive load {rate:.1f}/s")
                alone = Phase("interactive alone", rate)
                await interactive(c, alone, float(args.baseline_s), rng)
                print(alone.row())
                mixed = Phase(f"interactive + {args.lines}-line batch", rate)
                ended = asyncio.Event()
                batch_job = asyncio.create_task(run_batch(sdk, args.lines, ended))
                await interactive(c, mixed, ended, rng)
                batch = await batch_job
                print(mixed.row(), batch.status, batch.request_counts)
        except BaseException:
            for proc in (api, worker):
                print(f"--- {proc.name} log ---\n{proc.log_tail()}", file=sys.stderr)
            raise
        finally:
            for proc in (worker, api):
                await proc.stop(timeout_s=30)
            redis_info = await cluster.redis.version()
    report = render(args, capacity, alone, mixed, batch, redis_info, load_start)
    write_report(args.out, report)
    print(f"wrote {args.out}")
    return 0


def render(args: argparse.Namespace, capacity: float, alone: Phase, mixed: Phase, batch: Any,
           redis_info: str, load_start: float) -> str:  # fmt: skip
    counts = batch.request_counts
    span_s = (batch.completed_at or time.time()) - (batch.in_progress_at or batch.created_at)
    throughput = counts.completed / span_s
    ratio = percentile(mixed.latencies_s, 99) / percentile(alone.latencies_s, 99)
    met = batch.status == "completed" and ratio <= 1.5 and mixed.refused == 0
    load = (load_start, os.getloadavg()[0])
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = (
        "make bench-batch" if not args.argv else f".venv/bin/python bench/batch.py {args.argv}"
    )
    return f"""# Batch API under interactive load

{report_head(f"`{command}`", args.commit, f"{now}, seed {args.seed}", redis_info, load)}

Goal (interactive p99 with the batch at most 1.5 x without it, no interactive submit
refused, the batch completed): **{"met" if met else "not met"}** (p99 ratio {ratio:.2f}).

## Setup

- Own `redis-server`, 1 `ponder api` + 1 `ponder worker` (one worker loop), scripted
  engine with `{args.step_ms}` ms per step (base, per row), continuous batching of up to
  {args.max_rows} rows; `PONDER_MAX_PENDING={args.max_pending}`;
  `PONDER_BATCH_MAX_IN_FLIGHT={args.in_flight}`; the feeder's other defaults
  (`PONDER_BATCH_INTERACTIVE_SHARE=0.5`,
  `PONDER_BATCH_PRIORITY=5`, `PONDER_BATCH_TICK_S=0.2`).
- Capacity: {args.capacity_tasks} fast tasks submitted at once: **{capacity:.1f} tasks/s**.
- Interactive load: fast tasks (1 sample, priority 3), Poisson arrivals at {args.load:g} x
  capacity = **{alone.rate:.1f}/s**; latency = `finished_at - created_at` of each task.
- Batch: {args.lines} fast chat-completion lines, uploaded with `files.create` and run with
  `batches.create` (official `openai` SDK), while the same interactive load goes on.

## Results

| phase | submitted | done | p50 | p99 | max | refused |
|---|---|---|---|---|---|---|
{alone.row()}
{mixed.row()}

| batch | value |
|---|---|
| status | {batch.status} |
| lines completed / failed / total | {counts.completed} / {counts.failed} / {counts.total} |
| in progress → completed | {span_s:.1f} s |
| throughput | **{throughput:.1f} lines/s** ({throughput / capacity:.0%} of capacity) |
| interactive p99 with / without the batch | {ratio:.2f} x |
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=2000, help="lines of the batch")
    p.add_argument("--load", type=float, default=0.5, help="interactive load, x capacity")
    p.add_argument("--baseline-s", type=float, default=120, help="interactive-alone phase")
    p.add_argument("--capacity-tasks", type=int, default=300)
    p.add_argument("--step-ms", default="25,1", help="scripted engine: base,per_row ms a step")
    p.add_argument("--max-rows", type=int, default=16, help="PONDER_ENGINE_MAX_ROWS")
    p.add_argument("--in-flight", type=int, default=8, help="PONDER_BATCH_MAX_IN_FLIGHT")
    p.add_argument("--max-pending", type=int, default=500, help="PONDER_MAX_PENDING")
    p.add_argument("--seed", type=int, default=1)
    args = parse_cluster_args(p, "batch.md", argv)
    args.argv = " ".join(sys.argv[1:] if argv is None else argv)
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
