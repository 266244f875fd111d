"""Cancel latency across processes: from the API's DELETE to the worker stopping the row.

Run with ``make bench-cancel`` (``.venv/bin/python bench/cancels.py``); writes
``bench/results/cancels.md``.

Over its own ``redis-server`` (a free loopback port, never the machine's shared Redis) the
script starts one ``ponder api`` and one ``ponder worker`` (scripted engine, run through
``harness.py --as-worker``, which logs the moment the worker tells the engine to stop a
sample: ``C time task index``). ``--background`` tasks that never finish keep the worker
busy; then, one at a time, ``--tasks`` such tasks are submitted, followed until their
sample is in the engine, and cancelled. One cancel's latency is the time from just before
the ``DELETE`` is sent to the worker's cancel of the engine row (wall clocks of one
machine): the API's write, the store's cancel notice, the worker's wake-up and its stop of
the run. Nothing in that path polls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from harness import (
    load_avg,
    own_cluster,
    parse_cluster_args,
    percentile,
    report_head,
    write_report,
)

PREFIX = "cancels"
HANG = {"prompt": "[[hang]]", "mode": "fast"}


class EngineLog:
    """Reads the worker's engine log as it grows (``S``/``F``/``C`` lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.started: set[str] = set()
        self.cancelled: dict[str, float] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].decode().splitlines():
            kind, at, task_id, _ = line.split()
            if kind == "S":
                self.started.add(task_id)
            elif kind == "C":
                self.cancelled.setdefault(task_id, float(at))

    async def until(self, check: str, task_id: str, timeout_s: float = 30) -> None:
        """Until the log shows ``task_id`` started (``S``) or cancelled (``C``); the log is a
        file of another process, so this watches it every 2 ms (outside what is measured)."""
        deadline = time.monotonic() + timeout_s
        seen = self.started if check == "S" else self.cancelled
        while task_id not in seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{task_id}: no {check} line in {timeout_s} s")
            await asyncio.sleep(0.002)
            self.read()


async def main(args: argparse.Namespace) -> int:
    load_start = os.getloadavg()[0]
    uptime = await asyncio.to_thread(load_avg)
    async with own_cluster(PREFIX, args.keep_logs) as cluster:
        url = cluster.url
        api = cluster.api()
        log = EngineLog(cluster.logdir / "engine.log")
        worker = cluster.worker("w1", log.path, worker_max_tasks=args.background + 4)
        latencies: list[float] = []
        try:
            await api.start()
            await worker.start()
            await cluster.ready(1)
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                for _ in range(args.background):
                    task = (await c.post("/v1/tasks", json=HANG)).json()
                    await log.until("S", task["id"])
                for _ in range(args.tasks):
                    task = (await c.post("/v1/tasks", json=HANG)).json()
                    await log.until("S", task["id"])
                    sent_at = time.time()
                    r = await c.delete(f"/v1/tasks/{task['id']}")
                    if r.status_code != 200:
                        raise RuntimeError(f"cancel answered {r.status_code}: {r.text[:200]}")
                    await log.until("C", task["id"])
                    latencies.append(log.cancelled[task["id"]] - sent_at)
            version = await cluster.redis.version()
        finally:
            await worker.stop(timeout_s=30)
            await api.stop(timeout_s=30)
    report = render(args, latencies, version, uptime, (load_start, os.getloadavg()[0]))
    await asyncio.to_thread(write_report, Path(args.out), report)
    print(report)
    print(f"wrote {args.out}")
    return 0


def render(
    args: argparse.Namespace,
    latencies: Sequence[float],
    redis_ver: str,
    uptime: str,
    load: tuple[float, float],
) -> str:
    ms = [x * 1000 for x in latencies]
    rows = [(q, percentile(ms, q)) for q in (50, 90, 99)] + [(100, max(ms))]
    command = " ".join(["bench/cancels.py", *sys.argv[1:]])
    return "\n".join(
        [
            "# Cancel latency across processes",
            "",
            report_head(
                f"`{command}` (`make bench-cancel`)",
                args.commit,
                f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
                redis_ver,
                load,
            ),
            "",
            f"`uptime` at start: `{uptime}`.",
            "",
            f"1 `ponder api` + 1 `ponder worker` over their own Redis, scripted engine; "
            f"{args.background} tasks that never finish keep the worker busy; {len(ms)} more "
            "are cancelled one at a time, each once its sample is in the engine.",
            "",
            "Latency of one cancel: from just before the `DELETE /v1/tasks/{id}` is sent to "
            "the worker process telling the engine to stop the task's sample (the API's "
            "write, the store's cancel notice, the worker's wake-up; no polling).",
            "",
            "| percentile | latency (ms) |",
            "|---|---|",
            *(f"| p{q} | {v:.2f} |" if q < 100 else f"| max | {v:.2f} |" for q, v in rows),
            "",
            f"Goal: p99 under 100 ms: **{'met' if rows[2][1] < 100 else 'missed'}**.",
            "",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=300, help="cancels measured")
    p.add_argument("--background", type=int, default=16, help="running tasks around them")
    return parse_cluster_args(p, "cancels.md", argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse_args())))
