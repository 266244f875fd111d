"""Chaos run: tasks keep their guarantees while workers are SIGKILLed and Redis restarts.

Run with ``make chaos`` (``.venv/bin/python bench/chaos.py``); writes
``bench/results/chaos.md``.

Over its own ``redis-server`` (a free loopback port, AOF with ``appendfsync always``;
never the machine's shared Redis) the script starts one ``ponder api`` and three
``ponder worker`` processes with the scripted engine, then:

- submits ``--tasks`` tasks (default 2,000) at ``--rate`` per second: modes fast /
  standard / deep (40/40/20 %), priorities 0..5, per-sample latencies of 50-1500 ms
  (``[[sleep_ms]]``), each with an ``Idempotency-Key`` so a submit retried after a 503 or a
  dropped connection never makes a second task;
- SIGKILLs a random worker every 3-6 s and starts a replacement (a new node id, as a
  restarted host would have), until every task has ended;
- SIGKILLs Redis once, 40 % into the submissions, keeps it down ``--redis-down-s`` (3 s)
  and restarts it on the same port and data directory (the AOF brings the data back);
- cancels 5 % of the accepted tasks, each 0-3 s after its submit;
- runs ``--engine-workers`` (1) more ``ponder worker`` with the default engine (OpenVINO
  GenAI's pipeline in an engine process of its own, SmolLM2-135M, 2 tasks at a time) and
  SIGKILLs its engine process every ``--engine-kill-s`` (12-20 s), busy or idle as it
  happens, then once more, idle, after the drain: each death must be logged exactly once
  (``engine openvino: … died (signal 9); pid N, …``) and the engine live again
  (``ponder_engine_up`` on the worker's metrics port) before the next.

With ``--two-models`` the workers serve different models: a models file names two
scripted models, ``a`` and ``b``; half the ``--workers`` (4) run ``ponder worker --models
a``, the others ``--models b`` (each replacement after a kill serves its victim's model);
every task names one of the two, and ``--queue-timeout-share`` (10 % there) of them a
``queue_timeout_s`` of 0.5-3 s (those pending through the Redis outage expire). No
openvino worker runs in that mode. The report (``bench/results/chaos-models.md``) gives
lost / twice / stuck per model, the tasks that ended ``expired``, and checks that none of
those ever started (no ``running`` event) and that every task ran on its own model.

Then it audits, from the API and from Redis: accepted tasks, how they ended, lost tasks
(accepted, then unknown: must be 0), tasks finished twice (more than one terminal event in
the task's event log: must be 0), tasks stuck in a non-terminal state after the run (must
be 0), samples recomputed, and the takeover time after each kill: the queue entries the
killed worker held (read from the consumer group right after the SIGKILL) until each of
their tasks started again on another worker (its next ``running`` event).

Workers here are ``ponder worker`` run through ``harness.py --as-worker``, which only adds
a log line per sample the engine starts, returns or is told to stop; a sample computed
twice (once by a killed worker, again after the reclaim) is a recomputed one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

import harness
from harness import (
    RESULTS,
    Proc,
    RedisProc,
    free_port,
    own_cluster,
    parse_cluster_args,
    percentile,
    report_head,
    write_report,
)

#: a task's final statuses (``expired``: not started within its ``queue_timeout_s``)
TERMINAL = harness.TERMINAL
SELF = Path(__file__).resolve()
#: the two models of ``--two-models``
MODELS = ("a", "b")
MODELS_FILE = "".join(f'[models.{m}]\nengine = "scripted"\n\n' for m in MODELS)

# --- the run ------------------------------------------------------------------------


@dataclass
class Submitted:
    index: int
    body: dict[str, Any]
    key: str
    task_id: str | None = None
    submit_attempts: int = 0
    cancel: str | None = None  # outcome of the planned cancel


@dataclass
class Kill:
    at: float  # seconds into the run
    wall: float  # time.time() of the SIGKILL
    worker: str
    held: list[str] | None  # task ids of the entries it held (None: Redis was down)


@dataclass
class EngineKill:
    at: float  # seconds into the run
    worker: str
    pid: int  # the engine process's
    busy: bool  # rows were running in it (ponder_engine_rows{state="running"} > 0)
    noticed_s: float | None = None  # until ponder_engine_up read 0 (None: not seen)
    back_s: float | None = None  # until it read 1 again (None: not within 120 s)


@dataclass
class EngineWorker:
    proc: Proc
    metrics_url: str


@dataclass
class Run:
    args: argparse.Namespace
    url: str = ""
    tasks: list[Submitted] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)  # "POST 503 unavailable", ...
    kills: list[Kill] = field(default_factory=list)
    engine_kills: list[EngineKill] = field(default_factory=list)
    details: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # attempts, error
    partial_samples: Counter[str] = field(default_factory=Counter)  # unfinished, in partials
    served: dict[str, str] = field(default_factory=dict)  # worker process -> its model
    #: per task, from the API after the run: (its model, created_at as epoch seconds)
    seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    redis_restart_at: float | None = None
    redis_down_s: float | None = None
    outage_wall: tuple[float, float] | None = None  # time.time() while Redis was down
    load: tuple[float, float] = (0.0, 0.0)
    started_at: str = field(
        default_factory=lambda: f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    t0: float = 0.0
    submits_done: asyncio.Event = field(default_factory=asyncio.Event)
    all_ended: asyncio.Event = field(default_factory=asyncio.Event)


def make_body(i: int, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    mode = rng.choices(["fast", "standard", "deep"], weights=[40, 40, 20])[0]
    sleep_ms = rng.randint(50, 1500)
    answers = ", ".join(str(rng.choice([7, 7, 7, 8])) for _ in range(3))
    body = {
        "prompt": f"chaos task {i} [[answers: {answers}]] [[sleep_ms: {sleep_ms}]]",
        "mode": mode,
        "task_type": "text",
        "priority": rng.randint(0, 5),
        "metadata": {"i": i},
    }
    # drawn only in the modes that use them: the one-model run's tasks stay as they were
    if args.two_models:
        body["model"] = rng.choice(MODELS)
    if args.queue_timeout_share and rng.random() < args.queue_timeout_share:
        body["queue_timeout_s"] = round(rng.uniform(0.5, 3), 2)
    return body


def model_of(item: Submitted) -> str:
    return str(item.body.get("model", "ponder"))


async def call(run: Run, c: httpx.AsyncClient, method: str, url: str, **kw: Any) -> httpx.Response:
    """One request, retried (same body, same Idempotency-Key) while the answer is a 503 or
    the connection fails; every answer is counted."""
    deadline = time.monotonic() + 180
    delay = 0.2
    while True:
        try:
            r = await c.request(method, url, **kw)
        except httpx.TransportError as e:
            run.answers[f"{method} {type(e).__name__}"] += 1
        else:
            code = ""
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = r.json()["error"]["code"]
            run.answers[f"{method} {r.status_code} {code}".strip()] += 1
            if r.status_code != 503:
                return r
            delay = max(delay, float(r.headers.get("retry-after", "1")) / 2)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{method} {url}: no answer but 503 for 180 s")
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 1.5, 2.0)


async def submit_all(run: Run, c: httpx.AsyncClient, rng: random.Random) -> None:
    args = run.args
    cancel_set = set(rng.sample(range(args.tasks), round(args.tasks * args.cancel_share)))
    jobs: list[asyncio.Task[None]] = []

    async def one(item: Submitted, cancel_after: float | None) -> None:
        r = await call(
            run, c, "POST", "/v1/tasks", json=item.body, headers={"Idempotency-Key": item.key}
        )
        item.submit_attempts += 1
        if r.status_code not in (200, 202):
            raise RuntimeError(f"submit {item.index}: {r.status_code} {r.text[:200]}")
        item.task_id = r.json()["id"]
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            r = await call(run, c, "DELETE", f"/v1/tasks/{item.task_id}")
            item.cancel = {200: "cancelled", 409: "already ended"}.get(r.status_code, str(r))

    for i in range(args.tasks):
        await asyncio.sleep(max(0.0, run.t0 + i / args.rate - time.monotonic()))
        item = Submitted(i, make_body(i, rng, args), uuid.uuid4().hex)
        run.tasks.append(item)
        cancel_after = rng.uniform(0, 3) if i in cancel_set else None
        jobs.append(asyncio.create_task(one(item, cancel_after)))
    await asyncio.gather(*jobs)
    run.submits_done.set()


async def chaos_monkey(
    run: Run,
    workers: list[Proc],
    start_worker: Any,
    rng: random.Random,
    redis_url: str,
    prefix: str,
) -> None:
    """SIGKILL a random worker every 3-6 s, replacing it, until every task has ended."""
    while not run.all_ended.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_ended.wait(), rng.uniform(3, 6))
            return
        victim = rng.randrange(len(workers))
        old = workers[victim]
        await old.kill()
        wall = time.time()
        model = run.served[old.name]
        held = await held_entries(redis_url, prefix, model, worker_id(old.name, model))
        run.kills.append(Kill(time.monotonic() - run.t0, wall, old.name, held))
        workers[victim] = await start_worker(model)


def engine_pid(worker_pid: int) -> int | None:
    """The engine process of the worker ``worker_pid`` (its child running
    openvino_process.py), or None while it has none."""
    for children in Path(f"/proc/{worker_pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in children.read_text().split():
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                if b"openvino_process.py" in cmdline:
                    return int(child)
    return None


async def engine_figures(c: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """``ponder_engine_up`` and the running rows from a worker's metrics port."""
    text = (await c.get(metrics_url)).text
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('ponder_engine_up{engine="openvino"}'):
            figures["up"] = float(line.split()[-1])
        elif line.startswith('ponder_engine_rows{state="running"'):
            figures["running"] = float(line.split()[-1])
    return figures


async def kill_engine(run: Run, c: httpx.AsyncClient, worker: EngineWorker) -> None:
    """SIGKILL the worker's engine process; time until its metrics show it down (the
    supervisor noticed) and up again (restarted)."""
    pid = engine_pid(worker.proc.pid)
    if pid is None:
        return
    figures = await engine_figures(c, worker.metrics_url)
    os.kill(pid, 9)
    kill = EngineKill(time.monotonic() - run.t0, worker.proc.name, pid, figures["running"] > 0)
    run.engine_kills.append(kill)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:  # another process's state: polled
        with contextlib.suppress(httpx.HTTPError):
            up = (await engine_figures(c, worker.metrics_url))["up"]
            if up == 0 and kill.noticed_s is None:
                kill.noticed_s = time.monotonic() - t0
            # down, then up: a restart loads the model for seconds, far longer than a poll
            if up == 1 and kill.noticed_s is not None:
                kill.back_s = time.monotonic() - t0
                return
        await asyncio.sleep(0.01)


async def engine_monkey(
    run: Run, engine_workers: list[EngineWorker], rng: random.Random, c: httpx.AsyncClient
) -> None:
    """SIGKILL an engine worker's engine process every --engine-kill-s until every task
    has ended, then once more (idle)."""
    low, high = (float(x) for x in run.args.engine_kill_s.split(","))
    while engine_workers and not run.all_ended.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_ended.wait(), rng.uniform(low, high))
            break
        await kill_engine(run, c, rng.choice(engine_workers))
    for worker in engine_workers:
        await kill_engine(run, c, worker)  # idle: nothing is left to run


def engine_deaths_logged(run: Run, engine_workers: list[EngineWorker]) -> dict[int, int]:
    """Per killed engine pid, how many log lines of its worker report its death."""
    logs = {w.proc.name: w.proc.log_path.read_text(errors="replace") for w in engine_workers}
    return {
        k.pid: sum(
            1
            for line in logs.get(k.worker, "").splitlines()
            if "died (signal 9)" in line and f"pid {k.pid}," in line
        )
        for k in run.engine_kills
    }


def worker_id(node: str, model: str) -> str:
    """The id of a process's (first) worker loop of ``model``: its consumer name."""
    return f"{node}-w0" if model == "ponder" else f"{node}-{model}-w0"


def queue_key(prefix: str, model: str, level: int) -> str:
    """A model's stream of one priority level (the default model's keys have no name)."""
    return f"{prefix}:q:{level}" if model == "ponder" else f"{prefix}:q:{model}:{level}"


async def held_entries(redis_url: str, prefix: str, model: str, consumer: str) -> list[str] | None:
    """Task ids of the queue entries ``consumer`` holds in ``model``'s queues (None if
    Redis does not answer)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=2)
    held: list[str] = []
    try:
        for p in range(6):
            key = queue_key(prefix, model, p)
            pending: Any = await client.xpending_range(key, "workers", "-", "+", 1000, consumer)
            for entry in pending:
                found: Any = await client.xrange(key, entry["message_id"], entry["message_id"])
                held += [fields["task"] for _, fields in found]
    except aioredis.RedisError:
        return None
    finally:
        await client.aclose()
    return held


async def redis_restart(run: Run, redis_server: RedisProc) -> None:
    at = run.args.tasks / run.args.rate * 0.4
    await asyncio.sleep(max(0.0, run.t0 + at - time.monotonic()))
    run.redis_restart_at = time.monotonic() - run.t0
    t0, wall0 = time.monotonic(), time.time()
    await redis_server.kill()
    await asyncio.sleep(run.args.redis_down_s)  # a restart that takes a while
    await redis_server.start()
    run.redis_down_s = time.monotonic() - t0
    run.outage_wall = (wall0, time.time())


async def statuses(c: httpx.AsyncClient, ids: Sequence[str], run: Run) -> dict[str, str]:
    """``{id: status}`` from the API (404 → "lost"), 16 requests at a time."""
    out: dict[str, str] = {}
    gate = asyncio.Semaphore(16)

    async def one(task_id: str) -> None:
        async with gate:
            r = await call(run, c, "GET", f"/v1/tasks/{task_id}")
        if r.status_code != 200:
            out[task_id] = f"lost ({r.status_code})"
            return
        task = r.json()
        out[task_id] = task["status"]
        created = datetime.datetime.fromisoformat(task["created_at"]).timestamp()
        run.seen[task_id] = (task.get("model", "ponder"), created)
        error = (task.get("error") or {}).get("code")
        run.details[task_id] = (int(task.get("attempts", 0)), error)
        if task["status"] == "partial_done":
            for sample in task.get("samples", []):
                if sample["status"] not in ("done", "skipped"):
                    reason = (sample.get("error") or {}).get("message") or "-"
                    run.partial_samples[f"{sample['status']} ({reason})"] += 1

    await asyncio.gather(*(one(i) for i in ids))
    return out


async def wait_all_ended(run: Run, redis_url: str, prefix: str, timeout_s: float) -> None:
    """Until every accepted task is terminal, watched cheaply in Redis (the API is asked
    once, at the end); a Redis outage only delays the watch."""
    await run.submits_done.wait()
    deadline = time.monotonic() + timeout_s
    open_ids = [t.task_id for t in run.tasks if t.task_id]
    client = aioredis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    try:
        while open_ids and time.monotonic() < deadline:
            try:
                async with client.pipeline(transaction=False) as pipe:
                    for task_id in open_ids:
                        pipe.hget(f"{prefix}:task:{task_id}", "status")
                    got: list[Any] = await pipe.execute()
            except aioredis.RedisError:
                got = [None] * len(open_ids)
            open_ids = [i for i, st in zip(open_ids, got, strict=True) if st not in TERMINAL]
            if open_ids:
                await asyncio.sleep(0.5)
    finally:
        await client.aclose()
        run.all_ended.set()


async def audit_events(
    redis_url: str, prefix: str, ids: Sequence[str], models: Sequence[str]
) -> dict[str, Any]:
    """Per task, from its event log: terminal events, starts, samples kept on reclaim."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    twice: list[str] = []
    kept = reclaimed = 0
    starts_at: dict[str, list[float]] = {}  # task -> times of its running events (server)
    try:
        for chunk_start in range(0, len(ids), 200):
            chunk = ids[chunk_start : chunk_start + 200]
            async with client.pipeline(transaction=False) as pipe:
                for task_id in chunk:
                    pipe.xrange(f"{prefix}:ev:{task_id}")
                logs: list[Any] = await pipe.execute()
            for task_id, entries in zip(chunk, logs, strict=True):
                terminal = 0
                starts = 0
                saved_before_last_start = 0
                saved = 0
                for entry_id, fields in entries:
                    data = json.loads(fields["data"])
                    if fields["event"] == "result":
                        terminal += 1
                    elif fields["event"] == "status":
                        if data.get("status") in TERMINAL:
                            terminal += 1
                        elif data.get("status") == "running":
                            starts += 1
                            saved_before_last_start = saved
                            starts_at.setdefault(task_id, []).append(
                                int(entry_id.split("-")[0]) / 1000
                            )
                    elif fields["event"] == "sample" and data.get("status") == "done":
                        saved += 1
                if terminal > 1:
                    twice.append(task_id)
                if starts > 1:
                    reclaimed += 1
                    kept += saved_before_last_start
        queues = {}
        names: set[str] = set()
        for model in models:
            for p in range(6):
                key = queue_key(prefix, model, p)
                if not await client.exists(key):
                    queues[(model, p)] = (0, 0)  # no task of this level ever
                    continue
                pending = (await client.xpending(key, "workers"))["pending"]
                queues[(model, p)] = (await client.xlen(key), pending)
                names |= {c["name"] for c in await client.xinfo_consumers(key, "workers")}
        consumers = len(names)
    finally:
        await client.aclose()
    return {
        "twice": twice,
        "reclaimed_tasks": reclaimed,
        "kept_samples": kept,
        "queues": queues,
        "consumers": consumers,
        "starts_at": starts_at,
    }


@dataclass
class Takeovers:
    per_kill: list[float]  # per kill that held tasks: until the last of them started again
    per_task: list[float]  # per task taken over: until it started again
    kills_holding: int  # kills of a worker that held queue entries
    unknown: int  # kills during the Redis outage (entries not readable)
    by_kill: dict[int, float]  # id(kill) -> its takeover time


def takeovers(kills: Sequence[Kill], starts_at: dict[str, list[float]]) -> Takeovers:
    """How long after each kill the dead worker's tasks started again elsewhere (a task
    that ended meanwhile, e.g. cancelled, or never started again, is left out)."""
    per_kill: list[float] = []
    per_task: list[float] = []
    by_kill: dict[int, float] = {}
    holding = unknown = 0
    for kill in kills:
        if kill.held is None:
            unknown += 1
            continue
        holding += bool(kill.held)
        waits = [
            min(t for t in starts_at.get(task_id, []) if t > kill.wall) - kill.wall
            for task_id in kill.held
            if any(t > kill.wall for t in starts_at.get(task_id, []))
        ]
        per_task += waits
        if waits:
            per_kill.append(max(waits))
            by_kill[id(kill)] = max(waits)
    return Takeovers(per_kill, per_task, holding, unknown, by_kill)


@dataclass
class EngineWork:
    started: int  # sample runs begun by the engine, all workers
    distinct: int  # distinct (task, sample) pairs among them
    rerun: int  # runs beyond the first of a pair: work redone
    finished_twice: int  # of those, runs the engine had completed before (not saved)
    finished_in_outage: int  # of those, first completed while Redis was down


def read_engine_logs(paths: Sequence[Path], outage: tuple[float, float] | None) -> EngineWork:
    started: Counter[tuple[str, str]] = Counter()
    finished: dict[tuple[str, str], list[float]] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue  # a line cut short by a SIGKILL
            pair = (parts[2], parts[3])
            if parts[0] == "S":
                started[pair] += 1
            elif parts[0] == "F":
                finished.setdefault(pair, []).append(float(parts[1]))
    twice = [sorted(ts) for ts in finished.values() if len(ts) > 1]
    lo, hi = outage or (0.0, 0.0)
    return EngineWork(
        started=sum(started.values()),
        distinct=len(started),
        rerun=sum(n - 1 for n in started.values()),
        finished_twice=sum(len(ts) - 1 for ts in twice),
        finished_in_outage=sum(1 for ts in twice if lo <= ts[0] <= hi),
    )


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    prefix = "chaos"
    load_start = os.getloadavg()[0]
    async with own_cluster(prefix, args.keep_logs, aof=True) as cluster:
        redis_server, url, tmp = cluster.redis, cluster.url, cluster.logdir
        common = {
            "lease_s": args.lease_s,
            "claim_block_ms": 500,
            "store_timeout_s": 2,
            "scripted_step_ms": "20,2",
            "engine_max_rows": 32,
            "shutdown_grace_s": 5,
        }
        models: tuple[str, ...] = ("ponder",)
        if args.two_models:
            models_file = tmp / "models.toml"
            models_file.write_text(MODELS_FILE)
            common["models_file"] = str(models_file)
            models = MODELS
        api = cluster.api(**{k: v for k, v in common.items() if k == "models_file"})
        workers: list[Proc] = []
        engine_logs: list[Path] = []
        serial = iter(range(1, 10_000))

        async def start_worker(model: str) -> Proc:
            n = next(serial)
            log = tmp / f"engine-w{n}.log"
            engine_logs.append(log)
            proc = cluster.worker(f"w{n}", log, **common)
            if model != "ponder":  # `ponder worker --models <model>`, its samples logged
                proc.argv = [sys.executable, str(SELF), "--as-worker", str(log), model]
            run.served[proc.name] = model
            return await proc.start()

        engine_workers: list[EngineWorker] = []

        async def start_engine_worker(n: int) -> EngineWorker:
            metrics_port = free_port()
            proc = cluster.worker(
                f"e{n}",
                **{**common, "engine_max_rows": 8},
                engine="openvino",
                engine_threads=1,
                worker_max_tasks=2,
                metrics_port=metrics_port,
                host="127.0.0.1",
            )
            await proc.start()
            return EngineWorker(proc, f"http://127.0.0.1:{metrics_port}/metrics")

        run = Run(args, url=url)
        try:
            await api.start()
            for i in range(args.workers):
                workers.append(await start_worker(models[i % len(models)]))
            for n in range(1, args.engine_workers + 1):
                engine_workers.append(await start_engine_worker(n))
            await cluster.ready(args.workers + args.engine_workers, timeout_s=300)
            print(
                f"cluster ready: api {url}, {args.workers} workers (models "
                f"{', '.join(sorted(set(run.served.values())))}) + {args.engine_workers} "
                f"with the openvino engine, redis {redis_server.url}"
            )
            run.t0 = time.monotonic()
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as c:
                waiter = asyncio.create_task(
                    wait_all_ended(run, redis_server.url, prefix, args.drain_timeout_s)
                )
                monkey = asyncio.create_task(
                    chaos_monkey(run, workers, start_worker, rng, redis_server.url, prefix)
                )
                restart = asyncio.create_task(redis_restart(run, redis_server))
                engine_monkey_task = asyncio.create_task(
                    engine_monkey(run, engine_workers, random.Random(args.seed + 1), c)
                )
                await submit_all(run, c, rng)
                submitted_s = time.monotonic() - run.t0
                print(f"submitted {len(run.tasks)} tasks in {submitted_s:.0f} s; draining")
                await waiter
                await monkey
                await restart
                await engine_monkey_task
                ended_s = time.monotonic() - run.t0
                ids = [t.task_id for t in run.tasks if t.task_id]
                final = await statuses(c, ids, run)  # the user's view, after the run
            audit = await audit_events(redis_server.url, prefix, ids, models)
            work = read_engine_logs(engine_logs, run.outage_wall)
            run.load = (load_start, os.getloadavg()[0])
            version = await redis_server.version()
        finally:
            codes = {}
            for w in workers:
                codes[w.name] = await w.stop(timeout_s=30)
            for e in engine_workers:
                codes[e.proc.name] = await e.proc.stop(timeout_s=30)
            codes["api"] = await api.stop(timeout_s=30)
        audit["engine_logged"] = engine_deaths_logged(run, engine_workers)
        audit["engine_codes"] = [codes[e.proc.name] for e in engine_workers]
        audit["engine_error_lines"] = sum(
            1
            for e in engine_workers
            for line in e.proc.log_path.read_text(errors="replace").splitlines()
            if "ERROR" in line or "Traceback" in line
        )
        report = render(
            run, final, audit, work, codes, version,
            submitted_s, ended_s,
        )  # fmt: skip
        out = Path(args.out)
        await asyncio.to_thread(write_report, out, report)
        print(report)
        print(f"wrote {out}")
        return 0 if verdict(run, final, audit) else 1


def counts(
    run: Run, final: dict[str, str], audit: dict[str, Any], model: str | None = None
) -> dict[str, int]:
    """The audit's counts, of every task or of ``model``'s."""
    items = {t.task_id: t for t in run.tasks if t.task_id and model in (None, model_of(t))}
    mine = {i: s for i, s in final.items() if i in items}
    return {
        "accepted": len(items),
        "distinct_ids": len(set(items)),
        "lost": sum(1 for s in mine.values() if s.startswith("lost")),
        "twice": len(set(audit["twice"]) & set(items)),
        "stuck": sum(1 for s in mine.values() if s not in TERMINAL and not s.startswith("lost")),
        "expired": sum(1 for s in mine.values() if s == "expired"),
        # an expired task must never have run: no `running` event in its log
        "expired_started": sum(
            1 for i, s in mine.items() if s == "expired" and i in audit["starts_at"]
        ),
        # the task says it ran on another model than the one it named
        "wrong_model": sum(
            1 for i, t in items.items() if i in run.seen and run.seen[i][0] != model_of(t)
        ),
        "with_deadline": sum(1 for t in items.values() if "queue_timeout_s" in t.body),
    }


def late_starts(run: Run, audit: dict[str, Any]) -> list[float]:
    """Per task with a queue_timeout_s that started: how long after its deadline its
    first start came (negative: in time)."""
    late = []
    for t in run.tasks:
        if (
            t.task_id in audit["starts_at"]
            and t.task_id in run.seen
            and "queue_timeout_s" in t.body
        ):
            deadline = run.seen[t.task_id][1] + t.body["queue_timeout_s"]
            late.append(min(audit["starts_at"][t.task_id]) - deadline)
    return late


def verdict(run: Run, final: dict[str, str], audit: dict[str, Any]) -> bool:
    n = counts(run, final, audit)
    return (
        n["accepted"] == run.args.tasks
        and n["distinct_ids"] == n["accepted"]
        and n["lost"] == 0
        and n["twice"] == 0
        and n["stuck"] == 0
        and n["expired_started"] == 0
        and n["wrong_model"] == 0
        and engine_ok(run, audit)
    )


def engine_ok(run: Run, audit: dict[str, Any]) -> bool:
    """Every engine process death logged exactly once, noticed and followed by a live
    engine; the engine workers ended 0 without an error line."""
    kills = run.engine_kills
    return (
        len(kills) >= run.args.engine_workers
        and all(audit["engine_logged"].get(k.pid) == 1 for k in kills)
        and all(k.noticed_s is not None and k.back_s is not None for k in kills)
        and all(code == 0 for code in audit["engine_codes"])
        and audit["engine_error_lines"] == 0
    )


def render(
    run: Run,
    final: dict[str, str],
    audit: dict[str, Any],
    work: EngineWork,
    exit_codes: dict[str, int | None],
    redis_ver: str,
    submitted_s: float,
    ended_s: float,
) -> str:
    args = run.args
    n = counts(run, final, audit)
    late = late_starts(run, audit)
    taken = takeovers(run.kills, audit["starts_at"])
    by_status = Counter(s for s in final.values())
    attempts = Counter(a for a, _ in run.details.values())
    errors = Counter(e for _, e in run.details.values() if e)
    modes = Counter(t.body["mode"] for t in run.tasks)
    cancels = Counter(t.cancel for t in run.tasks if t.cancel)
    ok = verdict(run, final, audit)
    five_xx = {k: v for k, v in run.answers.items() if " 5" in k and "unavailable" not in k
               and "queue_full" not in k}  # fmt: skip

    def mark(value: int) -> str:
        return f"**{value}** {'✅' if value == 0 else '❌'}"

    lines = [
        "# Chaos run",
        "",
        report_head(
            "`.venv/bin/python bench/chaos.py --two-models`"
            if args.two_models
            else "`make chaos` (`.venv/bin/python bench/chaos.py`)",
            args.commit,
            f"seed {args.seed}, started {run.started_at}",
            redis_ver,
            run.load,
        ),
        "",
        f"Verdict: **{'PASS' if ok else 'FAIL'}** — every accepted task ended exactly once, "
        "none lost, none stuck."
        if ok
        else "Verdict: **FAIL** (see the table).",
        "",
        "## Setup",
        "",
        "- Own `redis-server` on a free loopback port, AOF on (`appendfsync always`); "
        "1 `ponder api` + "
        f"{args.workers} `ponder worker` processes, scripted engine (continuous batching, "
        "`20 ms + 2 ms/row` per step, up to 32 rows, per-sample `[[sleep_ms]]` of "
        "50-1500 ms).",
        f"- `PONDER_LEASE_S={args.lease_s:g}`, `PONDER_MAX_DELIVERIES=5` (default), "
        "shutdown grace 5 s.",
        f"- {args.tasks} tasks submitted at {args.rate:g}/s: "
        + ", ".join(f"{m} {modes[m]}" for m in ("fast", "standard", "deep"))
        + "; priorities 0..5 uniform; every submit carries an `Idempotency-Key` and is "
        "retried on 503 / connection errors.",
        f"- A random worker SIGKILLed every 3-6 s and replaced: **{len(run.kills)} kills**.",
        f"- Redis SIGKILLed once at t = {run.redis_restart_at or 0:.1f} s and restarted "
        f"(same port, same AOF): down for {run.redis_down_s or 0:.2f} s.",
        f"- {args.cancel_share:.0%} of the tasks cancelled 0-3 s after their submit.",
        *(
            [
                f"- {args.engine_workers} more `ponder worker` with the openvino engine "
                "(SmolLM2-135M, 1 thread, 2 tasks at a time, never SIGKILLed itself): its "
                f"engine process SIGKILLed every {args.engine_kill_s.replace(',', '-')} s, busy "
                "or idle as it happened, and once more after the drain (idle)."
            ]
            if args.engine_workers
            else []
        ),
        *setup_of_models(run),
        "",
        "## Results",
        "",
        "| figure | value |",
        "|---|---|",
        f"| tasks submitted | {len(run.tasks)} |",
        f"| accepted (202/200, distinct ids) | {n['accepted']} ({n['distinct_ids']} distinct) |",
        *(
            f"| ended `{s}` | {by_status[s]} |"
            for s in ("done", "partial_done", "failed", "cancelled", "expired")
        ),
        f"| **lost** (accepted, then unknown) | {mark(n['lost'])} |",
        f"| **finished twice** (>1 terminal event) | {mark(n['twice'])} |",
        f"| **stuck** non-terminal after the run | {mark(n['stuck'])} |",
        f"| tasks with a `queue_timeout_s` / ended `expired` | {n['with_deadline']} / "
        f"{n['expired']} |",
        f"| **expired, yet started** (a `running` event) | {mark(n['expired_started'])} |",
        "| tasks with a `queue_timeout_s` started after their deadline (their first "
        f"`running` event; max lateness) | {sum(x > 0 for x in late)}"
        + (f" ({max(late):+.3f} s)" if late else "")
        + " |",
        f"| **answered on another model** than the task named | {mark(n['wrong_model'])} |",
        "| unfinished samples of `partial_done` tasks | "
        + (", ".join(f"{k}: {v}" for k, v in sorted(run.partial_samples.items())) or "-")
        + " |",
        "| failed or expired, by `error.code` | "
        + (", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "-")
        + " |",
        f"| sample runs started by the engine | {work.started} ({work.distinct} distinct) |",
        f"| **samples recomputed** (run again: lost with a killed worker, or with a task "
        f"abandoned when Redis went down) | {work.rerun} |",
        f"| of which the engine had finished before (finished, not yet saved) | "
        f"{work.finished_twice} ({work.finished_in_outage} finished while Redis was down) |",
        f"| tasks reclaimed (started more than once) | {audit['reclaimed_tasks']} |",
        f"| **takeover after a kill** (until the last of its tasks started again), p50 / max "
        f"over {len(taken.per_kill)} kills | **{percentile(taken.per_kill, 50):.2f} s / "
        f"{max(taken.per_kill, default=float('nan')):.2f} s** (lease {args.lease_s:g} s) |",
        f"| takeover per task, p50 / max over {len(taken.per_task)} tasks | "
        f"{percentile(taken.per_task, 50):.2f} s / "
        f"{max(taken.per_task, default=float('nan')):.2f} s |",
        f"| kills of a worker holding tasks / while Redis was down (not measured) | "
        f"{taken.kills_holding} / {taken.unknown} |",
        "| takeover after each kill (t = kill time: entries held → s until the last "
        "started again) | "
        + ", ".join(
            f"t={k.at:.0f}: {'?' if k.held is None else len(k.held)}"
            + (f" → {w:.1f}" if (w := taken.by_kill.get(id(k))) is not None else "")
            for k in run.kills
        )
        + " |",
        f"| finished samples kept across those reclaims | {audit['kept_samples']} |",
        "| attempts per task | "
        + ", ".join(f"{k}: {attempts[k]}" for k in sorted(attempts))
        + " |",
        "| planned cancels | " + ", ".join(f"{k}: {v}" for k, v in sorted(cancels.items())) + " |",
        f"| 5xx other than 503 | {sum(five_xx.values())} |",
        f"| **engine process kills** (busy / idle) | {len(run.engine_kills)} "
        f"({sum(k.busy for k in run.engine_kills)} / "
        f"{sum(not k.busy for k in run.engine_kills)}) |",
        "| **engine deaths logged exactly once** | "
        f"{sum(audit['engine_logged'].get(k.pid) == 1 for k in run.engine_kills)} of "
        f"{len(run.engine_kills)} {'✅' if engine_ok(run, audit) else '❌'} |",
        "| engine down noticed (`ponder_engine_up` 0), p50 / max | "
        + seconds([k.noticed_s for k in run.engine_kills])
        + " |",
        "| engine live again after a kill, p50 / max | "
        + seconds([k.back_s for k in run.engine_kills])
        + " |",
        f"| engine workers' exit codes / error lines in their logs | "
        f"{audit['engine_codes']} / {audit['engine_error_lines']} |",
        f"| time to submit / to last end | {submitted_s:.0f} s / {ended_s:.0f} s |",
        "",
        *model_section(run, final, audit),
        "## Answers the client got (all retries counted)",
        "",
        "| request → answer | count |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(run.answers.items())),
        "",
        "## Queues after the run",
        "",
        "Acknowledged entries are deleted (`XACK` + `XDEL`), so the priority streams hold "
        "only what is still queued or in flight:",
        "",
        "| model | priority | XLEN | pending (unacked) |",
        "|---|---|---|---|",
        *(f"| {m} | {p} | {x} | {pe} |" for (m, p), (x, pe) in audit["queues"].items()),
        "",
        f"Consumer names known to the groups: {audit['consumers']} (a dead worker is removed "
        "from the group once its entries are taken over; the live workers remain).",
        "",
        "Exit codes at the end (SIGTERM): "
        + ", ".join(f"{k} {v}" for k, v in exit_codes.items())
        + ".",
        "",
        "## How the figures are measured",
        "",
        "- *accepted*: submits answered 202 (or 200 for a retried `Idempotency-Key`).",
        "- *lost*: an accepted id that `GET /v1/tasks/{id}` no longer knows (404).",
        "- *finished twice*: a task whose event log (`{prefix}:ev:{id}`, written atomically "
        "with each state change) holds more than one terminal event.",
        "- *stuck*: an accepted task not terminal when the run ends (every task has "
        f"{args.drain_timeout_s:g} s after the last submit).",
        "- *samples recomputed*: the workers log each sample the engine starts and "
        "returns; a `(task, sample)` pair started again is work redone after a kill: it "
        "was in the engine (or finished but not yet saved) when its worker died. Samples "
        "saved before a kill are never recomputed: the reclaiming worker runs only the "
        "missing ones (*finished samples kept*, counted from each task's event log: "
        "`sample` events before its last `running`).",
        "- *takeover after a kill*: right after each SIGKILL the entries the killed worker "
        "held are read from the consumer group (`XPENDING … consumer`); a task's takeover "
        "time is from the kill to its next `running` event (the event's stream id is "
        "Redis's clock, the kill time this machine's: the same clock); a kill's is that "
        "of the last of its tasks.",
        "",
    ]
    return "\n".join(lines)


def setup_of_models(run: Run) -> list[str]:
    """The setup lines of ``--two-models`` and ``--queue-timeout-share``."""
    args, lines = run.args, []
    if args.two_models:
        per_model = Counter(run.served.values())
        lines.append(
            f"- Two scripted models, `{MODELS[0]}` and `{MODELS[1]}` (a models file): each "
            "task names one at random; the workers serve one each (`ponder worker --models "
            f"a` / `--models b`, a replacement its victim's model): {len(run.served)} worker "
            "processes started in all, " + ", ".join(f"{m} {per_model[m]}" for m in MODELS) + "."
        )
    if args.queue_timeout_share:
        lines.append(
            f"- {args.queue_timeout_share:.0%} of the tasks with a `queue_timeout_s` of 0.5-3 s "
            "(uniform): not started by then, they end `expired` and must never run."
        )
    return lines


def model_section(run: Run, final: dict[str, str], audit: dict[str, Any]) -> list[str]:
    """Per model (``--two-models``): accepted, how they ended, lost / twice / stuck."""
    if not run.args.two_models:
        return []
    lines = [
        "## Per model",
        "",
        "| model | accepted | done | partial_done | failed | cancelled | expired | lost | "
        "twice | stuck | expired, yet started | answered on another model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        n = counts(run, final, audit, model)
        ids = {t.task_id for t in run.tasks if t.task_id and model_of(t) == model}
        ended = Counter(s for i, s in final.items() if i in ids)
        statuses = ("done", "partial_done", "failed", "cancelled", "expired")
        lines.append(
            f"| `{model}` | {n['accepted']} | "
            + " | ".join(str(ended[s]) for s in statuses)
            + f" | {n['lost']} | {n['twice']} | {n['stuck']} | {n['expired_started']} | "
            f"{n['wrong_model']} |"
        )
    return [*lines, ""]


def seconds(values: Sequence[float | None]) -> str:
    seen = [v for v in values if v is not None]
    missing = len(values) - len(seen)
    text = f"{percentile(seen, 50):.3f} s / {max(seen):.3f} s" if seen else "-"
    return text + (f" ({missing} never)" if missing else "")


def run_model_worker(engine_log: str, model: str) -> None:
    """harness's worker with its engine's samples logged (``harness.run_as_worker``),
    serving only ``model`` (``ponder worker --models <model>``)."""
    import ponder.cli

    app = ponder.cli.app

    def with_models() -> None:
        sys.argv += ["--models", model]
        app()

    ponder.cli.app = with_models  # what run_as_worker imports and calls
    harness.run_as_worker(engine_log)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--rate", type=float, default=25.0, help="submits per second")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default 3; 4 with --two-models)",
    )
    p.add_argument("--lease-s", type=float, default=3.0)
    p.add_argument("--cancel-share", type=float, default=0.05)
    p.add_argument("--redis-down-s", type=float, default=3.0, help="Redis outage length")
    p.add_argument("--drain-timeout-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--engine-workers",
        type=int,
        default=1,
        help="workers with the openvino engine whose engine processes are killed (0: none)",
    )
    p.add_argument(
        "--engine-kill-s", default="12,20", help="seconds between engine process kills: low,high"
    )
    p.add_argument(
        "--two-models",
        action="store_true",
        help="two scripted models (a, b), each served by its own workers (--models a / b); "
        "no openvino worker; report bench/results/chaos-models.md",
    )
    p.add_argument(
        "--queue-timeout-share",
        type=float,
        default=None,
        help="share of the tasks with a queue_timeout_s of 0.5-3 s (default: 0.1 with "
        "--two-models, else 0)",
    )
    args = parse_cluster_args(p, "chaos.md", argv)
    if args.workers is None:
        args.workers = 4 if args.two_models else 3
    if args.queue_timeout_share is None:
        args.queue_timeout_share = 0.1 if args.two_models else 0.0
    if args.two_models:
        args.engine_workers = 0
        if args.out == RESULTS / "chaos.md":
            args.out = RESULTS / "chaos-models.md"
    return args


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--as-worker":
        run_model_worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse_args())))
