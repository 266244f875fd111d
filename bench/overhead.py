"""Benchmark: the service's own CPU cost per task, beside arq's no-op job (issue #23).

Run with ``make bench-overhead`` (``.venv/bin/python bench/overhead.py``; arq and py-spy
come from ``make peer-arq``, a virtualenv of their own). Writes
``bench/results/overhead.md``, ``overhead.png`` and ``overhead.json`` (``--quick``: a
smoke run of ~60 tasks a case, written under /tmp unless ``--out`` says otherwise).

Everything runs over a ``redis-server`` of the run's own (a free loopback port, no
persistence), so its CPU is attributable. **CPU per task** is the user + system CPU time
(``utime + stime`` of ``/proc/<pid>/stat``, plus those of reaped children) of every ponder
process and their children — ``ponder api`` and ``ponder worker`` (split), or ``ponder
serve`` (embedded, SQLite) — and of the redis-server, over the measured window, divided by
the tasks that finished ``done`` in it. The client's own CPU is reported beside it.

1. **Cases**: fast tasks (``mode=fast``) and standard tasks of 5 samples (``mode=standard,
   samples=5, early_stop=false``: all 5 run); on the scripted engine at 0 ms a step
   (``PONDER_SCRIPTED_STEP_MS=0,0``) and on the openai engine in front of a stand-in
   OpenAI-compatible server (a plain asyncio HTTP server in a subprocess: each request
   answered after 0.2 s, at most ``--standin-slots`` at once; streamed, one chunk per
   token, when the request asks, as vLLM does); split (``ponder api`` + one
   ``ponder worker`` over the Redis) and embedded (``ponder serve``, SQLite). Client:
   ``--clients`` (16) asyncio tasks on one event loop in this process, one shared httpx
   client, each submitting a task and polling ``GET /v1/tasks/{id}`` every 50 ms until
   it ends, for ``--tasks`` tasks: a closed loop, so tasks/s at saturation. Then open-loop
   Poisson arrivals at 50 % and 90 % of that rate: submit->done latency p50/p99.
2. **arq** 0.28 (the peer virtualenv), a no-op job through the same redis-server: 16
   concurrent clients enqueueing and waiting with ``Job.result(poll_delay=0.05)``,
   ``--arq-jobs`` jobs, CPU per job of the worker, the client and redis-server. Measured
   right before and right after ponder's split scripted fast case (interleaved), and right
   after each versions round's window of that case for the code under test.
3. **Profile** of the split scripted fast case: ``py-spy record --format raw --function``
   on the API and the worker during a closed loop (its own run, not a measured one),
   top entries by own time.
4. **Scale-out**: 1 API + 1 worker against 2 API processes behind one port (``ponder api
   --processes 2``) + 2 workers, interleaved; the Redis
   commands per task (``INFO commandstats``), ``redis-benchmark`` on the same machine, and
   what one Redis core carries on paper.
5. **Capacity**: the openai engine in front of a stand-in of its own whose capacity is
   below what ponder feeds on 2 cores (``--capacity-slots`` 8 at once x 0.2 s = 40
   requests/s), ``--capacity-clients`` (3 x slots) polling clients: completed tasks/s
   against that capacity.
6. **Versions** (only with ``--versions REV,REV,...``): the closed loop of each of
   ``--version-cases`` (default the split scripted fast case) for each commit's ``src/``,
   round-robin over the commits for ``--version-rounds`` rounds (every other round in
   reverse order), and the median ratio of each to the first (before/after figures from
   one run). The rounds of the code under test (when it is a commit without changes in
   ``src/``) count towards the goals too: a fast or standard-5 goal is judged on the
   median of that case's windows in the run, and the arq goal on the median ratio of the
   interleaved pairs (the case's own window against arq's runs around it, each round's
   window against the arq run right after it).

``--at-commit REV`` runs ponder from that commit's ``src/`` (a ``git archive`` in the run's
temporary directory, put first on the ponder processes' PYTHONPATH) rather than from the
working tree, so that a figure names the code it measured while others edit ``src/``.
``--only`` runs some parts (for development). Every process the run starts (redis-server,
the stand-in, ponder's, arq's, py-spy) is stopped before it exits, on failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import inspect
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from harness import STAND_IN, Proc, free_port, percentile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
ARQ_VENV = ROOT / ".venv-arq"
TERMINAL = {"done", "partial_done", "failed", "cancelled", "expired"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
SEED = 20261203
#: an open-loop point whose steady completion rate is below this share of its arrivals
#: fell behind (its latency is a queue's)
BEHIND = 0.9
#: the issue's figures (split, 600 fast tasks, 16 polling clients), for reference
ISSUE_BASELINE = {"scripted": (5.2, 0.4, 250), "openai": (7.7, 0.4, 149)}
ARQ_VERSION = "0.28.0"
#: py-spy samples only the thread holding the GIL: Python-level CPU, robust to threads that
#: are runnable but waiting for a core (which it would otherwise count as busy)
PY_SPY_FLAGS = ["--nonblocking", "--gil", "--function", "--rate", "200"]
PARTS = ("cases", "arq", "floor", "capacity", "scale", "versions", "profile", "redis-benchmark")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load1() -> float:
    return os.getloadavg()[0]


# --- CPU time from /proc ---------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("latin-1")
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields follow the last ')'
    return raw[raw.rindex(")") + 2 :].split()


def proc_table() -> dict[int, tuple[int, float, float]]:
    """pid -> (ppid, CPU seconds: utime + stime + cutime + cstime, of which system time:
    stime + cstime) of every process."""
    table: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        # fields[0] is the state (stat field 3): ppid is field 4, utime..cstime 14..17
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        sys_ticks = int(fields[12]) + int(fields[14])
        table[int(entry)] = (int(fields[1]), ticks / CLK_TCK, sys_ticks / CLK_TCK)
    return table


def own_cpu() -> tuple[float, float]:
    """This process's user + system CPU seconds, and its system seconds (all its threads;
    not its children)."""
    fields = _stat_fields(os.getpid())
    assert fields is not None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_by_role(roles: dict[str, list[int]]) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds of each role (the processes rooted at its pids and their children), and
    the system part of them; ``client`` is this process.

    A child's time counts while it lives (its own utime + stime) and, once reaped, in its
    parent's cutime + cstime: a delta over a window counts it once either way."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    sys_out: dict[str, float] = {}
    for role, roots in roles.items():
        total, system, stack, seen = 0.0, 0.0, list(roots), set()
        while stack:
            pid = stack.pop()
            if pid in seen or pid not in table:
                continue
            seen.add(pid)
            total += table[pid][1]
            system += table[pid][2]
            stack.extend(children.get(pid, ()))
        out[role], sys_out[role] = total, system
    out["client"], sys_out["client"] = own_cpu()
    return out, sys_out


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat), niced included."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


@dataclass
class Window:
    """CPU seconds by role (and their system part) and wall time over a measured window."""

    roles: dict[str, list[int]]
    cpu0: dict[str, float] = field(default_factory=dict)
    sys0: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0
    load0: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    sys_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    load_end: float = 0.0
    busy0: float = 0.0
    #: cores busy with work other than the measured processes and the client, on average
    other_cores: float = 0.0

    def start(self) -> Window:
        self.load0 = load1()
        self.busy0 = machine_busy_s()
        self.cpu0, self.sys0 = cpu_by_role(self.roles)
        self.t0 = time.monotonic()
        return self

    def stop(self) -> Window:
        self.wall_s = time.monotonic() - self.t0
        cpu1, sys1 = cpu_by_role(self.roles)
        self.cpu_s = {k: cpu1[k] - self.cpu0[k] for k in cpu1}
        self.sys_s = {k: sys1[k] - self.sys0[k] for k in sys1}
        busy = machine_busy_s() - self.busy0
        self.other_cores = max(0.0, busy - sum(self.cpu_s.values())) / self.wall_s
        self.load_end = load1()
        return self


# --- processes (harness.py: free_port, Proc, the stand-in's STAND_IN)--------------------


async def until(
    check: Callable[[], Any], what: str, timeout_s: float, procs: Sequence[Proc]
) -> Any:
    """Try ``check`` (returning, or awaiting to, a truthy value when ready) until the
    deadline. Between tries it waits for the exit of one of ``procs`` (then fails at once
    with its log), for 50 ms at most: a readiness check has no event of its own."""
    deadline = time.monotonic() + timeout_s
    exits = {asyncio.ensure_future(p.wait()): p for p in procs}
    try:
        while True:
            with contextlib.suppress(Exception):
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in procs)
                raise RuntimeError(f"{what}: not within {timeout_s:g} s\n{tails}")
            ended, _ = await asyncio.wait(exits, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            for future in ended:
                p = exits[future]
                raise RuntimeError(f"{p.name} exited while waiting for {what}:\n{p.log_tail()}")
    finally:
        for future in exits:
            future.cancel()


class Redis:
    """A redis-server of this run's own: free loopback port, no persistence."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = Proc(
            "redis-server",
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(logdir), "--protected-mode", "no"],
            dict(os.environ),
            logdir,
        )  # fmt: skip
        self.client: aioredis.Redis | None = None

    async def start(self) -> Redis:
        await self.proc.start()
        self.client = aioredis.Redis.from_url(self.url, decode_responses=True)
        client = self.client
        await until(lambda: client.ping(), "redis-server", 30, [self.proc])
        return self

    async def commandstats(self) -> dict[str, tuple[int, float]]:
        """command -> (calls, usec) since the start."""
        assert self.client is not None
        info = await self.client.info("commandstats")
        return {
            k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for k, v in info.items()
        }

    async def version(self) -> str:
        assert self.client is not None
        return str((await self.client.info("server"))["redis_version"])

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        await self.proc.stop()


class StandIn:
    """The stand-in OpenAI-compatible server (``harness.STAND_IN``) in a subprocess: every
    request answered after ``delay_s``, at most ``slots`` at once."""

    def __init__(self, logdir: Path, delay_s: float, slots: int) -> None:
        self.port = free_port()
        self.delay_s, self.slots = delay_s, slots
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = Proc(
            "stand-in",
            [sys.executable, "-c", STAND_IN, str(self.port), str(delay_s), str(slots)],
            dict(os.environ),
            logdir,
        )

    @property
    def capacity(self) -> float:
        return self.slots / self.delay_s

    async def stats(self) -> dict[str, int]:
        async with httpx.AsyncClient(timeout=5) as c:
            return dict((await c.get(f"{self.url}/stats")).json())

    async def start(self) -> StandIn:
        await self.proc.start()
        await until(self.stats, "the stand-in", 30, [self.proc])
        return self


#: ``--at-commit``: the ponder processes import ponder from this source tree (a ``git
#: archive`` of the commit) instead of the working tree's ``src``
PONDER_SRC: Path | None = None


def ponder_env(src: Path | None, **settings: object) -> dict[str, str]:
    """This run's environment for ponder (importing it from ``src``, else from
    :data:`PONDER_SRC`, else the installed one): none of the caller's PONDER_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
    if (src := src or PONDER_SRC) is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(src), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    env.update({"PONDER_API_KEYS": "", "PONDER_LOG_LEVEL": "WARNING"})
    env.update({f"PONDER_{k.upper()}": str(v) for k, v in settings.items()})
    return env


@dataclass
class ClusterSpec:
    deployment: str  # split | embedded
    engine: str  # scripted | openai
    apis: int = 1
    workers: int = 1
    #: run each process under ``python -m cProfile -o <dir>/<name>.prof`` (the fallback
    #: profiler); stopped by SIGINT so that cProfile writes its file
    cprofile_dir: Path | None = None
    #: ``--versions``: ponder's source tree of this commit (its ``git archive``)
    src: Path | None = None
    version: str = ""

    @property
    def label(self) -> str:
        if self.deployment == "floor":
            return "floor"
        if self.version:
            return f"{self.deployment}, {self.engine} @ {self.version}"
        if self.deployment == "embedded":
            return f"embedded, {self.engine}"
        if (self.apis, self.workers) == (1, 1):
            return f"split, {self.engine}"
        return f"split {self.apis}+{self.workers}, {self.engine}"


class Cluster:
    """ponder's processes for one spec: ``ponder api`` x N + ``ponder worker`` x M over the
    run's Redis, or one ``ponder serve`` on a fresh SQLite file."""

    count = 0

    def __init__(self, spec: ClusterSpec, redis: Redis, standin: StandIn, workdir: Path) -> None:
        Cluster.count += 1
        self.spec = spec
        self.redis = redis
        self.standin = standin
        self.workdir = workdir
        self.prefix = f"ovh{Cluster.count}"
        settings: dict[str, object] = {"engine": spec.engine, "scripted_step_ms": "0,0"}
        if spec.engine == "openai":
            settings.update(openai_base_url=f"{standin.url}/v1", openai_model="stand-in")
        if spec.deployment == "split":
            settings.update(redis_url=redis.url, key_prefix=self.prefix)
        else:
            settings.update(sqlite_path=workdir / f"{self.prefix}.db")
        self.env = ponder_env(spec.src, **settings)
        self.ports: list[int] = []
        self.apis: list[Proc] = []
        self.workers: list[Proc] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def procs(self) -> list[Proc]:
        return self.apis + self.workers

    def roles(self) -> dict[str, list[int]]:
        if self.spec.deployment == "embedded":
            return {"serve": [p.pid for p in self.apis]}
        return {
            "api": [p.pid for p in self.apis],
            "worker": [p.pid for p in self.workers],
            "redis": [self.redis.proc.pid],
        }

    async def start(self) -> Cluster:
        pdir = self.spec.cprofile_dir

        def cli(name: str) -> list[str]:
            if pdir is None:
                return [sys.executable, "-m", "ponder.cli"]
            return [sys.executable, "-m", "cProfile", "-o", str(pdir / f"{name}.prof"),
                    "-m", "ponder.cli"]  # fmt: skip

        command = "serve" if self.spec.deployment == "embedded" else "api"
        port = free_port()
        self.ports.append(port)
        name = f"{self.prefix}-{command}"
        argv = [*cli(name), command, "--host", "127.0.0.1", "--port", str(port)]
        if self.spec.apis > 1:  # API processes sharing the port (children of this one)
            argv += ["--processes", str(self.spec.apis)]
        self.apis.append(await Proc(name, argv, self.env, self.workdir).start())
        if self.spec.deployment == "split":
            for i in range(self.spec.workers):
                name = f"{self.prefix}-worker{i}"
                argv = [*cli(name), "worker"]
                self.workers.append(await Proc(name, argv, self.env, self.workdir).start())
        need = self.spec.workers if self.spec.deployment == "split" else 1
        for url in self.urls:

            async def ready(url: str = url) -> bool:
                async with httpx.AsyncClient(base_url=url, timeout=5) as c:
                    r = await c.get("/readyz")
                    return r.status_code == 200 and r.json()["workers"] >= need

            await until(ready, f"{self.spec.label} ready", 120, self.procs)
        return self

    async def stop(self) -> None:
        sig = signal.SIGTERM if self.spec.cprofile_dir is None else signal.SIGINT
        for p in self.workers + self.apis:
            await p.stop(sig, timeout_s=60)


class FloorCluster(Cluster):
    """``bench/floor_service.py``: the same shape on the same stack, doing nothing else
    (an API process and a worker process with 16 claim loops, over the run's Redis)."""

    async def start(self) -> FloorCluster:
        script = str(Path(__file__).with_name("floor_service.py"))
        port = free_port()
        self.ports.append(port)
        argv = [sys.executable, script, "api", str(port), self.redis.url, self.prefix]
        self.apis.append(
            await Proc(f"{self.prefix}-floor-api", argv, self.env, self.workdir).start()
        )
        argv = [sys.executable, script, "worker", self.redis.url, self.prefix, "16"]
        self.workers.append(
            await Proc(f"{self.prefix}-floor-worker", argv, self.env, self.workdir).start()
        )

        async def ready() -> bool:
            async with httpx.AsyncClient(base_url=self.urls[0], timeout=5) as c:
                r = await c.get("/readyz")
                return r.status_code == 200 and r.json()["workers"] >= 1

        await until(ready, "the floor service ready", 60, self.procs)
        return self


# --- the ponder client -----------------------------------------------------------------


#: a case's mode with this suffix: the client follows the task's event stream (SSE,
#: without deltas, as the SDK's ``wait`` does) instead of polling
SSE = "+sse"


def task_body(mode: str, i: int) -> dict[str, Any]:
    mode = mode.removesuffix(SSE)
    if mode == "fast":
        return {"prompt": f"What is {i} + 1?", "mode": "fast"}
    return {"prompt": f"What is {i} + 1?", "mode": "standard", "samples": 5, "early_stop": False}


def parse_ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value).timestamp()


@dataclass
class TaskResult:
    status: str
    latency_s: float  # client: submit sent -> a poll saw it end
    server_s: float  # created_at -> finished_at of the task
    ended_at: float  # monotonic, when the client saw it end
    polls: int
    samples_done: int


class Client:
    """The benchmark's client: asyncio tasks over one httpx client per API URL."""

    def __init__(self, urls: Sequence[str], poll_s: float) -> None:
        # idle connections are dropped before uvicorn's keep-alive timeout (5 s) closes
        # them: a request on a connection the server is closing fails with ReadError
        limits = httpx.Limits(
            max_connections=256, max_keepalive_connections=256, keepalive_expiry=2.0
        )
        self.http = [httpx.AsyncClient(base_url=u, timeout=60, limits=limits) for u in urls]
        self.poll_s = poll_s
        self.errors: Counter[str] = Counter()

    async def aclose(self) -> None:
        for c in self.http:
            await c.aclose()

    async def run_task(self, i: int, body: dict[str, Any], follow: bool = False) -> TaskResult:
        """Submit, then poll every ``poll_s`` (the user's behaviour being measured) until
        the task ends, or (``follow``) read its event stream to the end. A refused submit
        (e.g. 503 queue_full: the run overloaded the service) ends the run: its figures
        would not be the service's cost per task."""
        http = self.http[i % len(self.http)]
        started = time.monotonic()
        r = await http.post("/v1/tasks", json=body)
        if r.status_code != 202:
            raise RuntimeError(f"submit: {r.status_code} {r.text[:300]}")
        task_id = r.json()["id"]
        if follow:
            return await self.follow(http, task_id, started)
        polls = 0
        while True:
            await asyncio.sleep(self.poll_s)
            polls += 1
            r = await http.get(f"/v1/tasks/{task_id}")
            if r.status_code != 200:
                self.errors[f"poll {r.status_code}"] += 1
                continue
            task = r.json()
            if task["status"] in TERMINAL:
                return task_result(task, started, polls)

    async def follow(self, http: httpx.AsyncClient, task_id: str, started: float) -> TaskResult:
        """The task's SSE stream without deltas, read to its terminal event (one request)."""
        url = f"/v1/tasks/{task_id}/events"
        async with http.stream("GET", url, params={"deltas": "false"}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"events: {r.status_code}")
            event = ""
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event in ("result", "status"):
                    data = json.loads(line[5:])
                    if event == "result":
                        return task_result(data, started, 1)
                    if data["status"] in TERMINAL:  # cancelled: no result event
                        return TaskResult(data["status"], time.monotonic() - started,
                                          float("nan"), time.monotonic(), 1, 0)  # fmt: skip
        raise RuntimeError(f"the event stream of {task_id} ended without a terminal event")


def task_result(task: dict[str, Any], started: float, polls: int) -> TaskResult:
    """What the client saw of a task that ended (its public JSON)."""
    ended = time.monotonic()
    created, finished = parse_ts(task.get("created_at")), parse_ts(task.get("finished_at"))
    server = finished - created if created and finished else float("nan")
    return TaskResult(
        task["status"], ended - started, server, ended, polls, int(task.get("samples_done") or 0)
    )


@dataclass
class Phase:
    """One measured window of ponder tasks."""

    case: str
    deployment: str
    engine: str
    mode: str
    loop: str  # closed | open 50% | open 90% | capacity | scale-out
    tasks: int
    done: int
    not_done: dict[str, int]
    wall_s: float
    tasks_per_s: float
    cpu_s: dict[str, float]
    cpu_ms_per_task: dict[str, float]
    sys_ms_per_task: dict[str, float]
    service_ms: float  # ponder processes + redis-server
    total_ms: float  # with the client
    p50_s: float
    p99_s: float
    server_p50_s: float
    server_p99_s: float
    polls_per_task: float
    samples_per_task: float
    load_start: float
    load_end: float
    other_cores: float
    offered_per_s: float = float("nan")
    steady_per_s: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(
    spec: ClusterSpec,
    mode: str,
    loop: str,
    window: Window,
    results: Sequence[TaskResult],
    offered: float = float("nan"),
) -> Phase:
    done = [r for r in results if r.status == "done"]
    n = max(1, len(done))
    per_task = {k: 1000 * v / n for k, v in window.cpu_s.items()}
    service = sum(v for k, v in per_task.items() if k != "client")
    ends = sorted(r.ended_at for r in done)
    steady = float("nan")
    if len(ends) >= 20:
        lo, hi = int(0.1 * len(ends)), int(0.9 * len(ends))
        if ends[hi] > ends[lo]:
            steady = (hi - lo) / (ends[hi] - ends[lo])
    return Phase(
        case=f"{spec.label}, {mode}",
        deployment=spec.deployment if (spec.apis, spec.workers) == (1, 1) else spec.label,
        engine=spec.engine,
        mode=mode,
        loop=loop,
        tasks=len(results),
        done=len(done),
        not_done=dict(Counter(r.status for r in results if r.status != "done")),
        wall_s=window.wall_s,
        tasks_per_s=len(done) / window.wall_s,
        cpu_s=window.cpu_s,
        cpu_ms_per_task=per_task,
        sys_ms_per_task={k: 1000 * v / n for k, v in window.sys_s.items()},
        service_ms=service,
        total_ms=service + per_task["client"],
        p50_s=percentile([r.latency_s for r in done], 50),
        p99_s=percentile([r.latency_s for r in done], 99),
        server_p50_s=percentile([r.server_s for r in done], 50),
        server_p99_s=percentile([r.server_s for r in done], 99),
        polls_per_task=sum(r.polls for r in results) / max(1, len(results)),
        samples_per_task=sum(r.samples_done for r in done) / n,
        load_start=window.load0,
        load_end=window.load_end,
        other_cores=window.other_cores,
        offered_per_s=offered,
        steady_per_s=steady,
    )


async def closed_loop(
    client: Client, mode: str, tasks: int, clients: int, start_index: int = 0
) -> list[TaskResult]:
    """``clients`` lanes, each submitting a task and polling it to its end, then the next."""
    indices = iter(range(start_index, start_index + tasks))
    results: list[TaskResult] = []

    async def lane() -> None:
        for i in indices:
            results.append(await client.run_task(i, task_body(mode, i), mode.endswith(SSE)))

    await asyncio.gather(*(lane() for _ in range(clients)))
    return results


async def open_loop(
    client: Client, mode: str, tasks: int, rate: float, seed: str, start_index: int
) -> tuple[list[TaskResult], float]:
    """Poisson arrivals at ``rate``/s, each task polled to its end on its own; the results
    and the arrivals' own rate (tasks over the time to the last arrival: a draw of 600
    arrivals is a few % off ``rate``)."""
    if tasks < 1:
        return [], float("nan")
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    jobs: list[asyncio.Task[TaskResult]] = []
    all_started = asyncio.Event()

    def start(i: int) -> None:
        jobs.append(asyncio.create_task(client.run_task(i, task_body(mode, i), mode.endswith(SSE))))
        if len(jobs) == tasks:
            all_started.set()

    t0, at = loop.time(), 0.0
    for k in range(tasks):  # each arrival scheduled on the loop's clock at its time
        at += rng.expovariate(rate)
        loop.call_at(t0 + at, start, start_index + k)
    await all_started.wait()
    return list(await asyncio.gather(*jobs)), tasks / at


@dataclass
class Settings:
    tasks: int
    clients: int
    poll_s: float
    warmup: int
    arq_jobs: int
    arq_poll_delay_s: float
    arq_max_jobs: int
    standin_delay_s: float
    standin_slots: int
    capacity_slots: int
    capacity_clients: int
    capacity_tasks: int
    profile_tasks: int
    scale_rounds: int
    #: ``--versions``: commits compared on ``version_cases``, interleaved
    versions: tuple[str, ...] = ()
    version_rounds: int = 4
    #: ``--version-cases``: (deployment, engine, mode) of each case the versions part runs
    version_cases: tuple[tuple[str, str, str], ...] = (("split", "scripted", "fast"),)
    cprofile: bool = False
    parts: tuple[str, ...] = PARTS
    #: the commit the cases run (short hash; "" when src/ has uncommitted changes): the
    #: versions part's rounds of it count towards the goals too
    code_commit: str = ""
    loads: tuple[float, ...] = (0.5, 0.9)


class Bench:
    def __init__(self, s: Settings, workdir: Path) -> None:
        self.s = s
        self.workdir = workdir
        self.redis = Redis(workdir)
        self.standin = StandIn(workdir, s.standin_delay_s, s.standin_slots)
        #: the capacity test's stand-in: fewer slots, a capacity below what ponder feeds
        self.capacity_standin = StandIn(workdir, s.standin_delay_s, s.capacity_slots)
        self.index = 0  # task numbering across the run (distinct prompts)
        self.phases: list[Phase] = []
        self.arq: list[dict[str, Any]] = []
        self.profile: dict[str, Any] = {}
        self.commandstats: dict[str, dict[str, Any]] = {}
        self.redis_bench: dict[str, Any] = {}
        self.notes: list[str] = []

    def next_indices(self, n: int) -> int:
        start = self.index
        self.index += n
        return start

    async def measure(
        self, cluster: Cluster, client: Client, mode: str, loop: str, run: Callable[[], Any]
    ) -> tuple[Phase, dict[str, tuple[int, float]] | None]:
        roles = cluster.roles()
        if cluster.spec.engine == "openai":
            roles["stand-in"] = [cluster.standin.proc.pid]
        split = cluster.spec.deployment == "split"
        stats0 = await self.redis.commandstats() if split else None
        window = Window(roles).start()
        results, offered = await run()
        window.stop()
        stats = None
        if stats0 is not None:
            stats1 = await self.redis.commandstats()
            stats = {
                k: (v[0] - stats0.get(k, (0, 0.0))[0], v[1] - stats0.get(k, (0, 0.0))[1])
                for k, v in stats1.items()
                if v[0] - stats0.get(k, (0, 0.0))[0] > 0
            }
        standin_ms = window.cpu_s.pop("stand-in", None)
        phase = summarize(cluster.spec, mode, loop, window, results, offered)
        if standin_ms is not None:
            phase.extra["stand_in_cpu_ms_per_task"] = 1000 * standin_ms / max(1, phase.done)
        if client.errors:
            phase.extra["client_errors"] = dict(client.errors)
            client.errors.clear()
        self.phases.append(phase)
        ms = phase.cpu_ms_per_task
        log(
            f"{phase.case} [{loop}]: {phase.done}/{phase.tasks} done, "
            f"{phase.tasks_per_s:.1f}/s, service {phase.service_ms:.2f} ms/task "
            f"({', '.join(f'{k} {v:.2f}' for k, v in ms.items())}), "
            f"p50 {phase.p50_s * 1000:.0f} ms p99 {phase.p99_s * 1000:.0f} ms, "
            f"load {phase.load_start:.2f}->{phase.load_end:.2f}, other work "
            f"{phase.other_cores:.2f} cores"
        )
        return phase, stats

    async def warm(self, client: Client, mode: str) -> None:
        await closed_loop(
            client, mode, self.s.warmup, self.s.clients, self.next_indices(self.s.warmup)
        )

    async def closed(
        self, cluster: Cluster, client: Client, mode: str, loop: str
    ) -> tuple[Phase, dict[str, tuple[int, float]] | None]:
        """A closed loop of ``mode`` tasks (saturation), measured and recorded as ``loop``."""
        s = self.s

        async def run() -> tuple[list[TaskResult], float]:
            start = self.next_indices(s.tasks)
            return await closed_loop(client, mode, s.tasks, s.clients, start), math.nan

        return await self.measure(cluster, client, mode, loop, run)

    async def case(self, cluster: Cluster, mode: str, open_loads: bool = True) -> Phase:
        """Closed loop (saturation), then open loop at each of ``loads`` x its rate."""
        s = self.s
        client = Client(cluster.urls, s.poll_s)
        try:
            await self.warm(client, mode)
            saturated, stats = await self.closed(cluster, client, mode, "closed")
            if stats is not None:
                self.commandstats[saturated.case] = {
                    "tasks": saturated.done,
                    "per_task": {k: v[0] / max(1, saturated.done) for k, v in stats.items()},
                    "usec_per_task": {k: v[1] / max(1, saturated.done) for k, v in stats.items()},
                }
            if open_loads:
                for load in s.loads:
                    rate = load * saturated.tasks_per_s

                    async def opened(rate: float = rate) -> tuple[list[TaskResult], float]:
                        start = self.next_indices(s.tasks)
                        seed = f"{SEED}-{cluster.spec.label}-{mode}-{rate}"
                        return await open_loop(client, mode, s.tasks, rate, seed, start)

                    await self.measure(cluster, client, mode, f"open {load:.0%}", opened)
            return saturated
        finally:
            await client.aclose()

    # --- arq -------------------------------------------------------------------------

    async def arq_run(self, label: str) -> dict[str, Any]:
        s = self.s
        py = str(ARQ_VENV / "bin" / "python")
        worker = await Proc(
            f"arq-worker-{len(self.arq)}",
            [py, "-c", ARQ_WORKER, str(self.redis.port), str(s.arq_max_jobs),
             str(s.arq_poll_delay_s)],
            dict(os.environ),
            self.workdir,
        ).start()  # fmt: skip
        client = Proc(
            f"arq-client-{len(self.arq)}",
            [py, "-c", ARQ_CLIENT, str(self.redis.port), str(s.arq_jobs), str(s.clients),
             str(s.poll_s), str(max(s.warmup, 2 * s.clients)),
             f"{worker.pid},{self.redis.proc.pid}"],
            dict(os.environ),
            self.workdir,
        )  # fmt: skip
        stats0 = await self.redis.commandstats()
        try:
            await client.start(stdout=asyncio.subprocess.PIPE)
            assert client.proc is not None and client.proc.stdout is not None
            out = await asyncio.wait_for(client.proc.stdout.read(), 600)
            await client.proc.wait()
            if client.proc.returncode != 0 or not out.strip():
                raise RuntimeError(f"the arq client failed:\n{client.log_tail()}")
        finally:
            await client.stop()
            await worker.stop()
        stats1 = await self.redis.commandstats()
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        n = max(1, result["done"])
        cpu = {
            "worker": result["cpu"][str(worker.pid)],
            "redis": result["cpu"][str(self.redis.proc.pid)],
            "client": result["client_cpu"],
        }
        result.update(
            label=label,
            cpu_s=cpu,
            cpu_ms_per_job={k: 1000 * v / n for k, v in cpu.items()},
            jobs_per_s=result["done"] / result["wall_s"],
            redis_calls_per_job={
                k: (v[0] - stats0.get(k, (0, 0.0))[0]) / n
                for k, v in stats1.items()
                if v[0] - stats0.get(k, (0, 0.0))[0] > 0
            },
        )
        ms = result["cpu_ms_per_job"]
        result["service_ms"] = ms["worker"] + ms["redis"]
        result["total_ms"] = result["service_ms"] + ms["client"]
        self.arq.append(result)
        log(
            f"arq ({label}): {result['done']} jobs, {result['jobs_per_s']:.1f}/s, "
            f"{result['total_ms']:.2f} ms/job (worker {ms['worker']:.2f}, redis "
            f"{ms['redis']:.2f}, client {ms['client']:.2f}), load "
            f"{result['load_start']:.2f}->{result['load_end']:.2f}, other work "
            f"{result['other_cores']:.2f} cores"
        )
        return result

    # --- profile ---------------------------------------------------------------------

    async def profile_loop(
        self, cluster: Cluster, attach: Callable[[], Awaitable[None]] | None = None
    ) -> tuple[int, float, float]:
        """The profiled load: fast tasks, open loop at 50 % of the split scripted fast
        case's saturated rate (measured here first if this run has not), so that the
        processes seldom wait for a core: a sampler counts a runnable thread as busy.
        ``attach`` runs after the warm-up, right before the profiled tasks."""
        client = Client(cluster.urls, self.s.poll_s)
        n = self.s.profile_tasks
        try:
            await self.warm(client, "fast")
            saturated = find(self, "split", "scripted", "fast", "closed")
            if saturated is not None:
                rate = 0.5 * saturated.tasks_per_s
            else:
                t0 = time.monotonic()
                k = self.s.tasks
                await closed_loop(client, "fast", k, self.s.clients, self.next_indices(k))
                rate = 0.5 * k / (time.monotonic() - t0)
            if attach is not None:
                await attach()
            t0 = time.monotonic()
            seed = f"{SEED}-profile"
            results, _ = await open_loop(client, "fast", n, rate, seed, self.next_indices(n))
            wall = time.monotonic() - t0
        finally:
            await client.aclose()
        return sum(r.status == "done" for r in results), wall, rate

    async def py_spy_profile(self, cluster: Cluster) -> bool:
        """py-spy on the API and the worker; False when it could not sample them."""
        py_spy = ARQ_VENV / "bin" / "py-spy"
        if not py_spy.exists():
            self.notes.append("py-spy is not installed (make peer-arq)")
            return False
        outs: dict[str, Path] = {}
        spies: dict[str, Proc] = {}

        async def attach() -> None:
            for role, proc in (("api", cluster.apis[0]), ("worker", cluster.workers[0])):
                outs[role] = self.workdir / f"profile-{role}.txt"
                spies[role] = await Proc(
                    f"py-spy-{role}",
                    [str(py_spy), "record", "--pid", str(proc.pid), "--format", "raw",
                     *PY_SPY_FLAGS, "-o", str(outs[role])],
                    dict(os.environ),
                    self.workdir,
                ).start()  # fmt: skip

        try:
            done, wall, rate = await self.profile_loop(cluster, attach)
            failed = [role for role, spy in spies.items() if not spy.alive()]
        finally:
            for spy in spies.values():
                await spy.stop(signal.SIGINT, timeout_s=60)
        for role, path in outs.items():
            if role in failed or not path.exists() or not path.stat().st_size:
                self.notes.append(
                    f"py-spy could not sample the {role}: {spies[role].log_tail(300)!r}"
                )
                return False
        self.profile = {
            "tasks": done,
            "wall_s": wall,
            "tasks_per_s": done / wall,
            "rate": rate,
            "tool": f"py-spy 0.4.3 `record --format raw {' '.join(PY_SPY_FLAGS)}` (only the "
            "thread holding the GIL is sampled: the Python-level CPU; system calls made "
            "with the GIL released, such as socket writes and epoll, are not in it: see the "
            "system-time share in the first table)",
            "unit": "samples",
        }
        for role, path in outs.items():
            self.profile[role] = read_profile(path)
        return True

    async def cprofile_profile(self, spec: ClusterSpec) -> None:
        """The fallback: the API and the worker run under cProfile, stopped by SIGINT."""
        import pstats

        pdir = self.workdir / "cprofile"
        pdir.mkdir(exist_ok=True)
        cluster = Cluster(
            ClusterSpec(spec.deployment, spec.engine, cprofile_dir=pdir),
            self.redis,
            self.standin,
            self.workdir,
        )
        try:
            await cluster.start()
            done, wall, rate = await self.profile_loop(cluster)
        finally:
            await cluster.stop()
        self.profile = {
            "tasks": done,
            "wall_s": wall,
            "tasks_per_s": done / wall,
            "rate": rate,
            "tool": "cProfile (`python -m cProfile -o`; deterministic: it slows the process "
            "and inflates small calls; its whole life, start-up included)",
            "unit": "ms",
        }
        for role, proc in (("api", cluster.apis[0]), ("worker", cluster.workers[0])):
            path = pdir / f"{proc.name}.prof"
            if not path.exists():
                self.notes.append(f"cProfile wrote nothing for the {role}")
                continue
            stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
            own = Counter[str]()
            idle = 0.0
            for (file, line, func), (_, _, tottime, _, _) in stats.items():
                if "epoll" in func or "select" in func:  # waiting for I/O: wall time, idle
                    idle += tottime
                    continue
                own[f"{func} ({short_path(file)}:{line})"] += tottime
            packages = Counter[str]()
            for name, t in own.items():
                packages[package_of(name)] += t
            total = sum(own.values())
            self.profile[role] = {
                "samples": round(1000 * total),
                "idle_ms": round(1000 * idle),
                "top": [(k, round(1000 * v, 1), share) for k, v, share in top_shares(own, 15)],
                "packages": top_shares(packages, 12),
            }

    async def profile_run(self, spec: ClusterSpec, force_cprofile: bool) -> None:
        if not force_cprofile:
            cluster = Cluster(spec, self.redis, self.standin, self.workdir)
            try:
                await cluster.start()
                ok = await self.py_spy_profile(cluster)
            finally:
                await cluster.stop()
            if ok:
                log(f"profile (py-spy): {self.profile['tasks_per_s']:.1f} tasks/s while sampled")
                return
            self.notes.append("profile: py-spy failed, cProfile instead")
        await self.cprofile_profile(spec)
        log(f"profile (cProfile): {self.profile['tasks_per_s']:.1f} tasks/s while profiled")

    # --- redis-benchmark -------------------------------------------------------------

    async def redis_benchmark(self) -> None:
        if shutil.which("redis-benchmark") is None:
            self.notes.append("redis-benchmark: not installed; left out")
            return
        port = str(self.redis.port)
        runs = {
            "SET": ["-n", "100000", "-q", "-t", "set"],
            "GET": ["-n", "100000", "-q", "-t", "get"],
            "XADD (one stream, MAXLEN ~ 10000)": ["-n", "100000", "-q", "xadd", "bench:stream",
                                                  "MAXLEN", "~", "10000", "*", "f", "v"],
            "EVAL (SET + GET)": ["-n", "100000", "-q", "eval",
                     "redis.call('set', KEYS[1], ARGV[1]); return redis.call('get', KEYS[1])",
                     "1", "bench:__rand_int__", "x"],
            "EVAL (5 HSET + HLEN)": ["-n", "50000", "-q", "eval",
                     "for i = 1, 5 do redis.call('hset', KEYS[1], 'f' .. i, ARGV[1]) end "
                     "return redis.call('hlen', KEYS[1])", "1", "bh:__rand_int__", "x"],
        }  # fmt: skip
        out: dict[str, Any] = {"runs": {}, "load_start": load1()}
        for name, args in runs.items():
            cpu0 = cpu_by_role({"redis": [self.redis.proc.pid]})[0]["redis"]
            t0 = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                "redis-benchmark", "-h", "127.0.0.1", "-p", port, *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            try:
                text = (await asyncio.wait_for(proc.communicate(), 300))[0].decode()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            wall = time.monotonic() - t0
            cpu = cpu_by_role({"redis": [self.redis.proc.pid]})[0]["redis"] - cpu0
            rates = [
                float(m[1])
                for line in re.split(r"[\r\n]+", text)
                if (m := re.search(r": ([\d.]+) requests per second", line))
            ]
            ops = int(args[args.index("-n") + 1]) * len(rates)
            shown = " ".join(f'"{a}"' if " " in a or "*" in a else a for a in args)
            out["runs"][name] = {
                "command": f"redis-benchmark -p PORT {shown}",
                "requests_per_s": rates[-1] if rates else float("nan"),
                "wall_s": wall,
                "redis_cpu_s": cpu,
                "redis_us_per_op": 1e6 * cpu / ops if ops else float("nan"),
            }
            log(f"redis-benchmark {name}: {rates}")
        out["load_end"] = load1()
        self.redis_bench = out


def read_profile(path: Path) -> dict[str, Any]:
    """Own time (leaf frames) by function and by package from py-spy's raw output."""
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    ponder_frames: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        own[frames[-1]] += n
        packages[package_of(frames[-1])] += n
        # the innermost frame of ponder's own code: which of its paths the time is under
        inner = next((f for f in reversed(frames) if "(ponder/" in f), "(no ponder frame)")
        ponder_frames[inner] += n
        total += n
    return {
        "samples": total,
        "top": top_shares(own, 15),
        "packages": top_shares(packages, 12),
        "ponder": top_shares(ponder_frames, 10),
    }


def top_shares(counter: Counter[str], k: int) -> list[tuple[str, float, float]]:
    total = sum(counter.values())
    return [(name, n, n / total) for name, n in counter.most_common(k)] if total else []


def short_path(file: str) -> str:
    """A source path as py-spy shortens it: from the package (or stdlib module) on."""
    for marker in ("site-packages/", "/src/", "/lib/python3.11/", "/lib/python3/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def package_of(frame: str) -> str:
    """'func (ponder/store/redis.py:12)' -> 'ponder.store'; 'f (httpx/_models.py:3)' ->
    'httpx'; 'f (asyncio/events.py:80)' -> 'asyncio' (py-spy shortens the paths)."""
    m = re.search(r"\((.*?):\d+\)$", frame)
    if not m:
        return frame
    parts = m[1].split("/")
    if parts[0] == "ponder" and len(parts) > 1:
        return "ponder." + parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py")


# --- arq, run by the peer virtualenv's interpreter -------------------------------------

ARQ_WORKER = r"""
import sys
from arq.connections import RedisSettings
from arq.worker import run_worker

async def noop(ctx):
    return None

class WorkerSettings:
    functions = [noop]
    redis_settings = RedisSettings(host="127.0.0.1", port=int(sys.argv[1]))
    max_jobs = int(sys.argv[2])
    poll_delay = float(sys.argv[3])

run_worker(WorkerSettings)
"""

ARQ_CLIENT = r"""
import asyncio, json, os, sys, time
from arq import create_pool
from arq.connections import RedisSettings

port, jobs, clients = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
poll, warmup = float(sys.argv[4]), int(sys.argv[5])
pids = [int(p) for p in sys.argv[6].split(",")]
tck = os.sysconf("SC_CLK_TCK")

def busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v[:3]) + sum(v[5:8])) / tck

def cpu(pid, children=True):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in ((11, 12, 13, 14) if children else (11, 12))) / tck

async def run(pool, n):
    indices = iter(range(n))
    done, latency = 0, []

    async def lane():
        nonlocal done
        for _ in indices:
            t = time.monotonic()
            job = await pool.enqueue_job("noop")
            await job.result(timeout=120, poll_delay=poll)
            latency.append(time.monotonic() - t)
            done += 1

    await asyncio.gather(*(lane() for _ in range(clients)))
    return done, sorted(latency)

async def main():
    pool = await create_pool(RedisSettings(host="127.0.0.1", port=port))
    await asyncio.wait_for(run(pool, warmup), 120)  # also: the worker is up
    load0 = os.getloadavg()[0]
    before = {p: cpu(p) for p in pids}
    me = cpu(os.getpid(), children=False)
    busy0 = busy()
    t0 = time.monotonic()
    done, latency = await run(pool, jobs)
    wall = time.monotonic() - t0
    after = {p: cpu(p) for p in pids}
    me = cpu(os.getpid(), children=False) - me
    ours = me + sum(after[p] - before[p] for p in pids)
    other = max(0.0, busy() - busy0 - ours) / wall
    await pool.aclose()
    pick = lambda q: latency[min(len(latency) - 1, round(q / 100 * (len(latency) - 1)))]
    print(json.dumps({"done": done, "wall_s": wall, "client_cpu": me,
                      "cpu": {str(p): after[p] - before[p] for p in pids},
                      "p50_s": pick(50), "p99_s": pick(99), "other_cores": other,
                      "load_start": load0, "load_end": os.getloadavg()[0]}))

asyncio.run(main())
"""


# --- the run ---------------------------------------------------------------------------


async def run_all(s: Settings, workdir: Path) -> Bench:
    bench = Bench(s, workdir)
    clusters: list[Cluster] = []

    @contextlib.asynccontextmanager
    async def cluster_of(
        spec: ClusterSpec, standin: StandIn | None = None
    ) -> AsyncIterator[Cluster]:
        kind = FloorCluster if spec.deployment == "floor" else Cluster
        cluster = kind(spec, bench.redis, standin or bench.standin, workdir)
        clusters.append(cluster)
        try:
            yield await cluster.start()
        finally:
            await cluster.stop()

    have_arq = (ARQ_VENV / "bin" / "python").exists()
    if not have_arq:
        bench.notes.append("arq: the peer virtualenv .venv-arq is missing (make peer-arq)")
    want = set(s.parts)
    arq = have_arq and "arq" in want
    try:
        await bench.redis.start()
        await bench.standin.start()
        if "capacity" in want:
            await bench.capacity_standin.start()
        bench.notes.append(f"redis-server {await bench.redis.version()}")

        async def floor(label: str) -> None:
            if "floor" in want:
                async with cluster_of(ClusterSpec("floor", "none")) as cluster:
                    phase = await closed_case(bench, cluster, "floor")
                    phase.extra["label"] = label

        if "cases" in want:
            # the key comparison, interleaved: arq, the floor, ponder split scripted fast,
            # arq, the floor
            if arq:
                await bench.arq_run("before")
            await floor("before")
            async with cluster_of(ClusterSpec("split", "scripted")) as cluster:
                await bench.case(cluster, "fast")
                if arq:
                    await bench.arq_run("after")
                await floor("after")
                await bench.case(cluster, "standard-5")
                await bench.case(cluster, f"fast{SSE}", open_loads=False)
            async with cluster_of(ClusterSpec("split", "openai")) as cluster:
                await bench.case(cluster, "fast")
                await bench.case(cluster, "standard-5")
                await bench.case(cluster, f"fast{SSE}", open_loads=False)
            for engine in ("scripted", "openai"):
                async with cluster_of(ClusterSpec("embedded", engine)) as cluster:
                    await bench.case(cluster, "fast")
                    await bench.case(cluster, "standard-5")
        elif arq:
            await bench.arq_run("alone")
        if "capacity" in want:
            # the openai engine in front of the stand-in, more clients than its slots
            async with cluster_of(
                ClusterSpec("split", "openai"), bench.capacity_standin
            ) as cluster:
                await capacity(bench, cluster)
        if "scale" in want:
            # interleaved: 1+1, 2+2, 1+1, 2+2
            for _ in range(s.scale_rounds):
                for n in (1, 2):
                    async with cluster_of(ClusterSpec("split", "scripted", n, n)) as cluster:
                        await scale_case(bench, cluster)
        if "versions" in want and s.versions:
            # round-robin over the commits, each from its own git archive; every other
            # round in reverse order (ABBA), since the later place in a round measured
            # 10-25 % more CPU in one run (the machine heating up, load rising)
            order = [(rev, checkout(rev, workdir / "versions" / rev)) for rev in s.versions]
            for r in range(s.version_rounds):
                for deployment, engine, mode in s.version_cases:
                    for rev, commit in order if r % 2 == 0 else order[::-1]:
                        src = workdir / "versions" / rev / "src"
                        spec = ClusterSpec(deployment, engine, src=src, version=commit)
                        async with cluster_of(spec) as cluster:
                            phase = await closed_case(bench, cluster, "version", mode)
                        paired = (deployment, engine, mode) == ("split", "scripted", "fast")
                        if arq and paired and commit == s.code_commit:
                            # arq right after each window of the code under test that the
                            # arq goal compares: a ratio per round, like the halving's
                            run = await bench.arq_run(f"round {r + 1}")
                            run["ponder_ms"] = phase.service_ms
        if "profile" in want:
            await bench.profile_run(ClusterSpec("split", "scripted"), s.cprofile)
        if "redis-benchmark" in want:
            await bench.redis_benchmark()
    finally:
        for cluster in clusters:
            await cluster.stop()
        await bench.standin.proc.stop()
        await bench.capacity_standin.proc.stop()
        await bench.redis.stop()
        await Proc.stop_all()
    return bench


async def capacity(bench: Bench, cluster: Cluster) -> None:
    s = bench.s
    client = Client(cluster.urls, s.poll_s)
    try:
        await bench.warm(client, "fast")
        before = await cluster.standin.stats()

        async def run() -> tuple[list[TaskResult], float]:
            start = bench.next_indices(s.capacity_tasks)
            return await closed_loop(
                client, "fast", s.capacity_tasks, s.capacity_clients, start
            ), math.nan

        phase, _ = await bench.measure(cluster, client, "fast", "capacity", run)
        after = await cluster.standin.stats()
    finally:
        await client.aclose()
    phase.extra.update(
        clients=s.capacity_clients,
        standin_capacity_per_s=cluster.standin.capacity,
        standin_served=after["served"] - before["served"],
        standin_streamed=after["streamed"] - before["streamed"],
        standin_peak=after["peak"],
        ratio_whole=phase.tasks_per_s / cluster.standin.capacity,
        ratio_steady=phase.steady_per_s / cluster.standin.capacity,
    )


async def closed_case(bench: Bench, cluster: Cluster, loop: str, mode: str = "fast") -> Phase:
    """A closed loop of ``mode`` tasks after a warm-up, recorded as ``loop``."""
    client = Client(cluster.urls, bench.s.poll_s)
    try:
        await bench.warm(client, mode)
        phase, _ = await bench.closed(cluster, client, mode, loop)
    finally:
        await client.aclose()
    return phase


async def scale_case(bench: Bench, cluster: Cluster) -> None:
    phase = await closed_case(bench, cluster, "scale-out")
    phase.extra["apis"], phase.extra["workers"] = cluster.spec.apis, cluster.spec.workers
    phase.extra["per_process_ms"] = {
        "api": phase.cpu_ms_per_task["api"] / cluster.spec.apis,
        "worker": phase.cpu_ms_per_task["worker"] / cluster.spec.workers,
    }


# --- the report ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def commit_of(rev: str) -> str | None:
    """``rev``'s short commit hash; None when this checkout has no such commit."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", "--short",
         f"{rev}^{{commit}}"],
        capture_output=True, text=True,
    )  # fmt: skip
    return found.stdout.strip() if found.returncode == 0 else None


def checkout(rev: str, into: Path) -> str:
    """``git archive`` of ``rev``'s src/ under ``into``; its short commit hash."""
    commit = commit_of(rev)
    if commit is None:
        raise RuntimeError(f"{rev!r} is not a commit of this checkout")
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def package_versions() -> dict[str, str]:
    """Versions of the libraries on ponder's hot paths in this virtualenv (optional
    accelerators such as httptools, uvloop, hiredis, orjson change the figures)."""
    from importlib import metadata

    out = {}
    for name in ("fastapi", "starlette", "pydantic", "uvicorn", "httptools", "uvloop",
                 "redis", "hiredis", "orjson", "httpx"):  # fmt: skip
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def code_version() -> tuple[str, bool]:
    """HEAD's short hash ("" outside git) and whether src/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "src"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "", False
    return head, bool(dirty)


def f2(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def ms(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{1000 * x:.0f}"


def rate_of(bench: Bench, deployment: str, engine: str, mode: str) -> float | None:
    phase = find(bench, deployment, engine, mode, "closed")
    return phase.tasks_per_s if phase else None


def service_sys(p: Phase) -> float:
    """The share of the service's CPU time spent in the kernel (stime)."""
    system = sum(v for k, v in p.sys_ms_per_task.items() if k not in ("client", "stand-in"))
    return system / p.service_ms if p.service_ms else math.nan


def find(bench: Bench, deployment: str, engine: str, mode: str, loop: str) -> Phase | None:
    for p in bench.phases:
        if (p.deployment, p.engine, p.mode, p.loop) == (deployment, engine, mode, loop):
            return p
    return None


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def same_code(bench: Bench, engine: str, mode: str) -> list[Phase]:
    """The run's closed-loop windows of a split case on the code under test: the case's own,
    then the versions part's rounds of the same commit (fresh processes each). This VM's
    speed moves from one window to the next (the openai fast+sse case of one code measured
    5.42 ms, then 3.22, 3.33 and 3.25 ms in one run, the client's own CPU moving with it),
    so a goal is judged on the median of them all."""
    return [
        p
        for p in bench.phases
        if (p.deployment, p.engine, p.mode) == ("split", engine, mode)
        and (
            p.loop == "closed"
            or (
                bench.s.code_commit
                and p.loop == "version"
                and version_of(p)[1] == bench.s.code_commit
            )
        )
    ]


def cost(windows: list[Phase]) -> float:
    """The median service CPU per task of ``windows``."""
    return statistics.median(p.service_ms for p in windows)


def arq_around(bench: Bench) -> list[dict[str, Any]]:
    """arq's runs right before and right after ponder's split scripted fast case."""
    return [a for a in bench.arq if a["label"] in ("before", "after")]


def arq_pairs(bench: Bench) -> list[tuple[float, float]]:
    """(ponder's split scripted fast service ms, arq's no-op job total ms) of each
    interleaved pair: the case's own window against the mean of arq's runs right before
    and after it, then each versions round's window of the code under test against the
    arq run right after it."""
    sf = find(bench, "split", "scripted", "fast", "closed")
    around = [a["total_ms"] for a in arq_around(bench)]
    pairs = [(sf.service_ms, statistics.mean(around))] if sf and around else []
    return pairs + [(a["ponder_ms"], a["total_ms"]) for a in bench.arq if "ponder_ms" in a]


def goals(bench: Bench) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def row(goal: str, measured: str, met: bool) -> None:
        rows.append({"goal": goal, "measured": measured, "met": met})

    def median_of(windows: list[Phase]) -> str:
        figures = ", ".join(f"{p.service_ms:.2f}" for p in windows)
        return f"{cost(windows):.2f} ms" + (f" (median of {figures})" if len(windows) > 1 else "")

    for engine, limit in (("scripted", 2.5), ("openai", 4.0)):
        for mode, client in (("fast", "polling"), (f"fast{SSE}", "following SSE")):
            if windows := same_code(bench, engine, mode):
                row(
                    f"fast task, {engine}, split, the client {client}: CPU per task "
                    f"(ponder + redis) <= {limit:g} ms",
                    median_of(windows),
                    cost(windows) <= limit,
                )
    for engine in ("scripted", "openai"):
        fast, five = same_code(bench, engine, "fast"), same_code(bench, engine, "standard-5")
        if fast and five:
            ratio = cost(five) / cost(fast)
            row(
                f"standard-5 <= 2x fast ({engine}, split)",
                f"{median_of(five)} / {median_of(fast)} = {ratio:.2f}x",
                ratio <= 2.0,
            )
    cap = next((p for p in bench.phases if p.loop == "capacity"), None)
    if cap:
        r, e = cap.extra["ratio_steady"], cap.extra
        row(
            ">= 0.9x the stand-in's capacity (openai, split)",
            f"{cap.steady_per_s:.1f} of {e['standin_capacity_per_s']:.0f} tasks/s = {r:.2f}x "
            f"(whole window incl. ramp and tail: {e['ratio_whole']:.2f}x)",
            r >= 0.9,
        )
    if pairs := arq_pairs(bench):
        ratios = [p / a for p, a in pairs]
        ratio = statistics.median(ratios)
        shown = ", ".join(f"{p:.2f} / {a:.2f} = {p / a:.2f}x" for p, a in pairs)
        row(
            "ponder's CPU per task <= 2x arq's no-op job (ponder api + worker + redis vs arq "
            "client + worker + redis)"
            + (", the median of the interleaved pairs' ratios" if len(pairs) > 1 else ""),
            f"{ratio:.2f}x ({shown})",
            ratio <= 2.0,
        )
    for case, commit, first, ratios, _ in version_ratios(bench):
        median = statistics.median(ratios)
        row(
            f"the title's halving: {case} at {commit} <= 0.5x {first} (`--versions`, the "
            "median of the rounds' ratios)",
            f"{median:.2f}x ({', '.join(f'{r:.2f}' for r in ratios)})",
            median <= 0.5,
        )
    return rows


def render(bench: Bench, meta: dict[str, Any], png: Path | None) -> str:
    s = bench.s
    L: list[str] = []
    add = L.append
    add("# Service overhead: CPU per task (issue #23)")
    add("")
    add(f"Command: `{meta['command']}`; {meta['date']}; code {meta['code']}.")
    m = meta["machine"]
    add(
        f"Machine: {m['platform']}, {m['cpu']}, {m['cores']} cores, Python {m['python']}; "
        f"{'; '.join(bench.notes)}."
    )
    add(
        "Libraries (ponder's virtualenv): "
        + ", ".join(f"{k} {v}" for k, v in meta["packages"].items())
        + "."
    )
    add(
        f"Load average (1 min) at start / end of the run: {meta['load_start']:.2f} / "
        f"{meta['load_end']:.2f} (a shared 2-core machine: each table gives its own phase's "
        "load at start -> end). Run time: "
        f"{meta['wall_s'] / 60:.1f} min."
    )
    add("")
    add(
        "**CPU per task** = user + system CPU time (`utime + stime` from `/proc/<pid>/stat`, "
        "plus reaped children's) of every ponder process and its children (`ponder api` + "
        "`ponder worker`, or `ponder serve`) and of this run's own redis-server, over the "
        "measured window, divided by the tasks finished `done` in it. *service* = ponder + "
        "redis-server; *client* = the benchmark's client process (not ponder's cost); "
        "*total* = both. The stand-in's CPU is not counted (reported in the JSON)."
    )
    add("")
    add(
        f"Client: {s.clients} asyncio tasks on one event loop in the benchmark's process, one "
        f"httpx client (keep-alive); each submits `POST /v1/tasks`, then polls "
        f"`GET /v1/tasks/{{id}}` every {s.poll_s * 1000:.0f} ms until the task ends, then "
        f"submits the next: a closed loop of {s.tasks} tasks per case after {s.warmup} "
        "warm-up tasks (its tasks/s is the saturation rate; with "
        f"{s.clients} clients and {s.poll_s * 1000:.0f} ms polls it can never exceed "
        f"{s.clients / s.poll_s:.0f} tasks/s). *fast{SSE}*: the client follows the task's "
        "event stream instead of polling (`GET /v1/tasks/{id}/events?deltas=false`, read to "
        "the `result` event: what the SDK's `wait` does; one request a task, no polling "
        "delay). Fast = `mode=fast` (1 sample); standard-5 = "
        "`mode=standard, samples=5, early_stop=false` (all 5 samples run). Scripted engine: "
        "`PONDER_ENGINE=scripted`, `PONDER_SCRIPTED_STEP_MS=0,0` (12 words a sample, 0 ms a "
        "step). openai engine: `PONDER_ENGINE=openai` in front of a stand-in "
        "OpenAI-compatible server (plain asyncio HTTP in its own process, every request "
        f"answered after {s.standin_delay_s:g} s, at most {s.standin_slots} at once: capacity "
        f"{bench.standin.capacity:.0f} requests/s; a task's 5 samples go as one request "
        "with n=5; a request that asks `stream: true` is answered as vLLM does, one "
        "`chat.completion.chunk` per token and choice). Every other setting is ponder's default "
        "(`PONDER_LOG_LEVEL=WARNING`, no API keys)."
    )
    add("")
    if any(p.loop == "closed" for p in bench.phases):
        add("## CPU per task at saturation (closed loop)")
        add("")
        add(
            "ms of CPU per finished task; api/worker columns hold `ponder serve` for embedded. "
            "*load*: 1-minute load average at the window's start -> end; *other work*: cores "
            "busy over the window (`/proc/stat`, niced work included) beyond the measured "
            "processes and the client, i.e. the stand-in and anything else on the machine."
        )
        add("")
        add(
            "| case | tasks done | tasks/s | api | worker | redis-server | **service** | of it "
            "system time | client | total | samples/task | polls/task | load | other work "
            "(cores) |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for p in bench.phases:
            if p.loop != "closed":
                continue
            c = p.cpu_ms_per_task
            api = c.get("api", c.get("serve", math.nan))
            add(
                f"| {p.case} | {p.done}/{p.tasks} | {p.tasks_per_s:.1f} | {f2(api)} | "
                f"{f2(c.get('worker', math.nan))} | {f2(c.get('redis', math.nan))} | "
                f"**{p.service_ms:.2f}** | {service_sys(p):.0%} | {c['client']:.2f} | "
                f"{p.total_ms:.2f} | "
                f"{p.samples_per_task:.1f} | {p.polls_per_task:.1f} | "
                f"{p.load_start:.2f} -> {p.load_end:.2f} | {p.other_cores:.2f} |"
            )
        add("")
        add(
            "For reference, the issue's figures before the work (split, 600 fast tasks, 16 "
            "polling clients): scripted 5.2 ms (redis 0.4), 250 tasks/s; openai 7.7 ms "
            "(redis 0.4), 149 tasks/s."
        )
        add("")
    if any(p.loop.startswith("open") for p in bench.phases):
        add("## Latency under open-loop load")
        add("")
        add(
            f"Poisson arrivals at {', '.join(f'{x:.0%}' for x in s.loads)} of the case's "
            f"saturated rate, {s.tasks} tasks each. *client* = submit sent -> a poll saw the "
            f"task end (includes up to {s.poll_s * 1000:.0f} ms of polling); *server* = the "
            "task's `created_at` -> `finished_at`. *offered* = the arrivals' own rate (the "
            "tasks over the time to the last arrival); **behind**: the tasks finished "
            f"between the 10th and 90th percentile of their end times ran below {BEHIND:g}x "
            "the arrivals, so the service fell behind in that minute and the point's "
            "latency is a growing queue's (the saturated rate it was set from was measured "
            "minutes earlier, on a machine whose speed moves)."
        )
        add("")
        add(
            "| case | load | offered /s | done /s | client p50 / p99 ms | server p50 / p99 ms | "
            "service ms/task | client ms/task | load avg | other work (cores) |"
        )
        add("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
        for p in bench.phases:
            if not p.loop.startswith(("open", "closed")):
                continue
            offered = "closed" if p.loop == "closed" else f"{p.offered_per_s:.1f}"
            behind = p.loop != "closed" and p.steady_per_s < BEHIND * p.offered_per_s
            done = f"{p.tasks_per_s:.1f}{' **behind**' if behind else ''}"
            add(
                f"| {p.case} | {p.loop} | {offered} | {done} | {ms(p.p50_s)} / "
                f"{ms(p.p99_s)} | {ms(p.server_p50_s)} / {ms(p.server_p99_s)} | "
                f"{p.service_ms:.2f} | {p.cpu_ms_per_task['client']:.2f} | "
                f"{p.load_start:.2f} -> {p.load_end:.2f} | {p.other_cores:.2f} |"
            )
        add("")
    if bench.arq:
        add(f"## arq {ARQ_VERSION}: a no-op job through the same redis-server")
        add("")
        add(
            "`.venv-arq` (`make peer-arq`). Worker: `run_worker` with "
            f"`max_jobs={s.arq_max_jobs}`, `poll_delay={s.arq_poll_delay_s:g}` s (arq polls "
            "its queue; its default 0.5 s would cap it far below ponder), no logging. "
            "Client: one process, "
            f"{s.clients} asyncio tasks over one `create_pool`, each `enqueue_job('noop')` then "
            f"`Job.result(poll_delay={s.poll_s:g})` (arq checks at once, then every "
            f"{s.poll_s * 1000:.0f} ms), {s.arq_jobs} jobs after a warm-up. Measured right before "
            "and right after ponder's split scripted fast case, and (*round N*) right after "
            "each versions round's window of that case for the code under test."
        )
        add("")
        add(
            "| run | jobs | jobs/s | worker | redis-server | client | worker + redis | "
            "**total** | p50 / p99 ms | redis calls/job | load | other work (cores) |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for a in bench.arq:
            c = a["cpu_ms_per_job"]
            calls = sum(a["redis_calls_per_job"].values())
            add(
                f"| {a['label']} | {a['done']} | {a['jobs_per_s']:.1f} | {c['worker']:.2f} | "
                f"{c['redis']:.2f} | {c['client']:.2f} | {a['service_ms']:.2f} | "
                f"**{a['total_ms']:.2f}** | {ms(a['p50_s'])} / {ms(a['p99_s'])} | {calls:.1f} | "
                f"{a['load_start']:.2f} -> {a['load_end']:.2f} | {a['other_cores']:.2f} |"
            )
        add("")
    render_floor(bench, add)
    if rows := goals(bench):
        add("## Goals (issue #23, requirement 2)")
        add("")
        if bench.s.code_commit and any(p.loop == "version" for p in bench.phases):
            add(
                "A fast or standard-5 figure is the median of this run's closed-loop windows "
                f"of the code under test ({bench.s.code_commit}): the case's own (the first "
                "figure) and the versions part's rounds of the same commit, each on fresh "
                "processes. This VM's speed moves from one window to the next, the client's "
                "own CPU per task with it; every window is in the tables below."
            )
            add("")
        add("| goal | measured | verdict |")
        add("|---|---|---|")
        for g in rows:
            add(f"| {g['goal']} | {g['measured']} | {verdict(g['met'])} |")
    sf = find(bench, "split", "scripted", "fast", "closed")
    if sf and (around := arq_around(bench)):
        arq_service = statistics.mean(a["service_ms"] for a in around)
        arq_total = statistics.mean(a["total_ms"] for a in around)
        add("")
        add(
            "The arq comparison sets ponder's service (API + worker + redis-server) against "
            "arq's whole path (client + worker + redis-server; around the case's own window, "
            "the mean of the runs before and after it), as the issue did: arq's client "
            "enqueues over Redis itself, the work ponder's API does "
            f"for its users. Like for like: service only {sf.service_ms:.2f} vs "
            f"{arq_service:.2f} ms ({sf.service_ms / arq_service:.1f}x); with each one's "
            f"client {sf.total_ms:.2f} vs {arq_total:.2f} ms "
            f"({sf.total_ms / arq_total:.1f}x)."
        )
    cap = next((p for p in bench.phases if p.loop == "capacity"), None)
    if cap:
        add("")
        add("## Keeping the stand-in busy")
        add("")
        e = cap.extra
        add(
            f"Split, openai engine, fast tasks, {e['clients']} polling clients (closed loop, "
            f"{cap.tasks} tasks), a stand-in of its own at {s.capacity_slots} requests at once x "
            f"{s.standin_delay_s:g} s = {e['standin_capacity_per_s']:.0f} requests/s. "
            f"Completed {cap.done} tasks in {cap.wall_s:.1f} s = {cap.tasks_per_s:.1f}/s "
            f"({e['ratio_whole']:.2f}x, ramp and tail included); between the 10th and 90th "
            f"percentile of completions {cap.steady_per_s:.1f}/s = **{e['ratio_steady']:.2f}x** "
            f"the capacity. The stand-in served {e['standin_served']} requests "
            f"({e['standin_streamed']} of them streamed: asked with `stream: true`), "
            f"at most {e['standin_peak']} at once"
            + (
                f" (for scale: the split openai fast closed loop above completed "
                f"{of_rate:.1f} tasks/s with its 16 clients)"
                if (of_rate := rate_of(bench, "split", "openai", "fast"))
                else ""
            )
            + f". CPU per task: service {cap.service_ms:.2f} ms "
            f"(api {f2(cap.cpu_ms_per_task['api'])}, worker "
            f"{f2(cap.cpu_ms_per_task['worker'])}, redis {f2(cap.cpu_ms_per_task['redis'])}), "
            f"client {cap.cpu_ms_per_task['client']:.2f} ms; load {cap.load_start:.2f} -> "
            f"{cap.load_end:.2f}."
        )
    render_scale(bench, add)
    render_versions(bench, add)
    render_profile(bench, add)
    if png is not None:
        add("")
        add(f"![CPU per task by case and process]({png.name})")
    add("")
    raw = png.with_suffix(".json").name if png is not None else "overhead.json"
    add(f"Raw figures: `{raw}` beside this report.")
    return "\n".join(L) + "\n"


def commands_row(case: str, per_task: dict[str, float], usec_per_task: float | None) -> str:
    """A row of the Redis-per-task table: Redis commands per task (or job) in all, the
    server's own µs per task (an empty cell if None), the 8 most called commands."""
    top = sorted(per_task.items(), key=lambda kv: -kv[1])[:8]
    usec = "" if usec_per_task is None else f"{usec_per_task:.0f} "
    return (
        f"| {case} | {sum(per_task.values()):.1f} | {usec}| "
        + ", ".join(f"{k} {v:.1f}" for k, v in top)
        + " |"
    )


def render_floor(bench: Bench, add: Callable[[str], None]) -> None:
    runs = [p for p in bench.phases if p.loop == "floor"]
    if not runs:
        return
    add("## The floor: ponder's shape on ponder's stack, doing nothing else")
    add("")
    add(
        "`bench/floor_service.py`: FastAPI on uvicorn (httptools, uvloop) and redis-py "
        "(hiredis), as ponder. `POST /v1/tasks` validates the body with a pydantic model and "
        "stores the task with one Lua script (record, queue entry, first event); `GET "
        "/v1/tasks/{id}` answers the stored record as it is (one HGET). Its worker: 16 loops, "
        "each XREADGROUP BLOCK for one entry, then one Lua script ending the task (record "
        "`done`, a `result` event, the entry acked). Two HTTP requests and four Redis round "
        "trips a task; no engine, no vote, no owners, limits, metrics or webhooks. Same "
        "client as ponder's cases (polling), same redis-server; right before and right after "
        "ponder's split scripted fast case."
    )
    add("")
    add(
        "| run | tasks done | tasks/s | api | worker | redis-server | **service** | client | "
        "polls/task | load | other work (cores) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for p in runs:
        c = p.cpu_ms_per_task
        add(
            f"| {p.extra.get('label', '')} | {p.done}/{p.tasks} | {p.tasks_per_s:.1f} | "
            f"{c['api']:.2f} | {c['worker']:.2f} | {c['redis']:.2f} | **{p.service_ms:.2f}** | "
            f"{c['client']:.2f} | {p.polls_per_task:.1f} | {p.load_start:.2f} -> "
            f"{p.load_end:.2f} | {p.other_cores:.2f} |"
        )
    floor_ms = statistics.fmean(p.service_ms for p in runs)
    add("")
    if sf := find(bench, "split", "scripted", "fast", "closed"):
        add(
            f"ponder's split scripted fast task: {sf.service_ms:.2f} ms = "
            f"{sf.service_ms / floor_ms:.2f}x the floor's {floor_ms:.2f} ms (the mean of its "
            f"runs): ponder's own work over the stack's is {sf.service_ms - floor_ms:.2f} ms a "
            f"task. The 2.5 ms goal leaves {2.5 - floor_ms:.2f} ms over this floor."
        )
        add("")


def render_versions(bench: Bench, add: Callable[[str], None]) -> None:
    runs = [p for p in bench.phases if p.loop == "version"]
    if not runs:
        return
    add("")
    add("## Versions compared (`--versions`)")
    add("")
    cases = ", ".join(f"{d} {e} {m}" for d, e, m in bench.s.version_cases)
    add(
        f"The closed loop ({bench.s.tasks} tasks, {bench.s.clients} clients, after a "
        f"warm-up) of each case ({cases}) for each commit's `src/` (a `git archive`), "
        f"round-robin over the commits, {bench.s.version_rounds} rounds, every other one "
        "in reverse order (a later place in a round can cost more): the machine's speed "
        "drifts over minutes, so compare within a round; the median ratio to the first "
        "commit is over the rounds. *api* holds `ponder serve` for embedded."
    )
    add("")
    add(
        "| case | commit | round | tasks/s | api | worker | redis-server | **service** | "
        "client | load | other work (cores) |"
    )
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    rounds: Counter[tuple[str, str]] = Counter()
    for p in runs:
        case, commit = version_of(p)
        rounds[case, commit] += 1
        c = p.cpu_ms_per_task
        api, worker, redis = (
            f"{c[k]:.2f}" if k in c else "n/a"
            for k in ("api" if "api" in c else "serve", "worker", "redis")
        )
        add(
            f"| {case} | {commit} | {rounds[case, commit]} | {p.tasks_per_s:.1f} | "
            f"{api} | {worker} | {redis} | **{p.service_ms:.2f}** | {c['client']:.2f} | "
            f"{p.load_start:.2f} -> {p.load_end:.2f} | {p.other_cores:.2f} |"
        )
    add("")
    for case, commit, first, ratios, controls in version_ratios(bench):
        relative = [r / c for r, c in zip(ratios, controls, strict=True)]
        add(
            f"- {case}: {commit} / {first}, service CPU per task, per round: "
            f"{', '.join(f'{r:.2f}' for r in ratios)}; median "
            f"**{statistics.median(ratios):.2f}**. The client's (its code the same for "
            f"both: a control for the machine's speed): "
            f"{', '.join(f'{c:.2f}' for c in controls)}; the service's ratio over the "
            f"client's: {', '.join(f'{r:.2f}' for r in relative)}, median "
            f"{statistics.median(relative):.2f}"
        )


def version_of(p: Phase) -> tuple[str, str]:
    """A versions run's (case, commit) from its case label ``LABEL @ COMMIT, MODE``."""
    label, _, rest = p.case.partition(" @ ")
    commit, _, mode = rest.partition(", ")
    return f"{label}, {mode}", commit


def version_ratios(bench: Bench) -> list[tuple[str, str, str, list[float], list[float]]]:
    """Per versions case and later commit: (case, commit, first commit, the rounds' service
    CPU ratios later / first, the client's same ratios: a control for the machine)."""
    by_case: dict[str, dict[str, list[Phase]]] = {}
    for p in bench.phases:
        if p.loop == "version":
            case, commit = version_of(p)
            by_case.setdefault(case, {}).setdefault(commit, []).append(p)
    out = []
    for case, by_commit in by_case.items():
        first, *others = by_commit
        for commit in others:
            pairs = list(zip(by_commit[first], by_commit[commit], strict=False))
            ratios = [b.service_ms / a.service_ms for a, b in pairs]
            controls = [b.cpu_ms_per_task["client"] / a.cpu_ms_per_task["client"] for a, b in pairs]
            out.append((case, commit, first, ratios, controls))
    return out


def render_scale(bench: Bench, add: Callable[[str], None]) -> None:
    scale = [p for p in bench.phases if p.loop == "scale-out"]
    if not scale:
        return
    add("")
    add("## Scale-out (requirement 3)")
    add("")
    add(
        "2 APIs are one `ponder api --processes 2`: two API processes sharing one port "
        "(uvicorn's supervisor; the kernel hands each connection to one of them), their CPU "
        "with the supervisor's; 2 workers are two `ponder worker` processes; all over the "
        "one redis-server. Split, "
        f"scripted, fast, closed loop of {bench.s.tasks} tasks, {bench.s.clients} clients; "
        "runs interleaved (1+1, 2+2, ...)."
    )
    add("")
    add(
        "| APIs + workers | tasks/s | api (all) | worker (all) | redis-server | service | "
        "per API process | per worker process | client | load | other work (cores) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for p in scale:
        c, e = p.cpu_ms_per_task, p.extra
        add(
            f"| {e['apis']}+{e['workers']} | {p.tasks_per_s:.1f} | {c['api']:.2f} | "
            f"{c['worker']:.2f} | {c['redis']:.2f} | **{p.service_ms:.2f}** | "
            f"{e['per_process_ms']['api']:.2f} | {e['per_process_ms']['worker']:.2f} | "
            f"{c['client']:.2f} | {p.load_start:.2f} -> {p.load_end:.2f} | "
            f"{p.other_cores:.2f} |"
        )
    add("")
    add("### Redis per task")
    add("")
    if bench.commandstats:
        add(
            "Commands redis-server ran per finished task (`INFO commandstats` over the closed "
            "loop; `evalsha`/`eval` are ponder's Lua scripts), with redis-server's own time "
            "per task by command (µs, its accounting):"
        )
        add("")
        add("| case | commands/task | µs/task (commandstats) | top commands (calls/task) |")
        add("|---|---:|---:|---|")
        for case, st in bench.commandstats.items():
            add(commands_row(case, st["per_task"], sum(st["usec_per_task"].values())))
        for a in bench.arq[:1]:
            add(commands_row("arq no-op job", a["redis_calls_per_job"], None))
    rb = bench.redis_bench
    if rb:
        add("")
        add(
            "`redis-benchmark` against the same redis-server (50 connections, its default; "
            "the tool shares the 2 cores with the server), requests/s and redis-server's CPU "
            f"per operation (load {rb['load_start']:.2f} -> {rb['load_end']:.2f}):"
        )
        add("")
        add("| operation | command | requests/s | redis-server CPU µs/op |")
        add("|---|---|---:|---:|")
        for name, r in rb["runs"].items():
            add(
                f"| {name} | `{r['command']}` | {r['requests_per_s']:,.0f} | "
                f"{r['redis_us_per_op']:.1f} |"
            )
    sf = find(bench, "split", "scripted", "fast", "closed")
    of = find(bench, "split", "openai", "fast", "closed")
    cap = next((p for p in bench.phases if p.loop == "capacity"), None)
    if sf:
        add("")
        add("### On paper")
        add("")
        add(on_paper(bench, sf, of, cap))


def on_paper(bench: Bench, sf: Phase, of: Phase | None, cap: Phase | None) -> str:
    """How many worker hosts one Redis core feeds, from redis-server's CPU per task."""
    shape = of or sf  # the openai engine is the shape of a deployment in front of GPUs
    redis_ms = shape.cpu_ms_per_task["redis"]
    per_core = 1000 / redis_ms if redis_ms > 0 else math.inf
    text = (
        f"redis-server spent {sf.cpu_ms_per_task['redis']:.2f} ms of CPU per fast task in the "
        "split scripted case"
        + (f" and {of.cpu_ms_per_task['redis']:.2f} ms in the split openai case" if of else "")
        + f" (every task polled every {bench.s.poll_s * 1000:.0f} ms through the API). Redis "
        f"runs commands on one thread, so one Redis core carries about {per_core:,.0f} tasks/s "
        f"of the {shape.engine} shape ({1000 / sf.cpu_ms_per_task['redis']:,.0f} of the "
        "scripted one)."
    )
    stats = bench.commandstats.get(shape.case)
    simple = bench.redis_bench.get("runs", {}).get("SET")
    if stats and simple:
        n = sum(stats["per_task"].values())
        text += (
            f" Cross-check: {n:.0f} commands per task (`INFO commandstats`) x "
            f"{simple['redis_us_per_op']:.1f} µs of redis-server CPU per SET under "
            f"redis-benchmark = {n * simple['redis_us_per_op'] / 1000:.2f} ms (Lua scripts "
            "cost more than a SET)."
        )
    worker_ms, api_ms = shape.cpu_ms_per_task["worker"], shape.cpu_ms_per_task["api"]
    rates = [20.0]
    if cap is not None:
        rates.insert(0, cap.extra["standin_capacity_per_s"])
    for rate in rates:
        text += (
            f" With worker hosts whose model server completes {rate:.0f} tasks/s each, one "
            f"Redis core feeds ~{per_core / rate:,.0f} hosts on paper; each host's "
            f"`ponder worker` then spends {rate * worker_ms / 1000:.2f} cores and the API tier "
            f"{rate * api_ms / 1000:.2f} cores per host."
        )
    text += (
        " Past that: several Redis instances (ponder does not shard its keys across "
        "instances today) or fewer commands per task."
    )
    return text


def render_profile(bench: Bench, add: Callable[[str], None]) -> None:
    pr = bench.profile
    if not pr:
        return
    unit = pr["unit"]
    add("")
    add("## Where ponder's time goes (split, scripted, fast)")
    add("")
    add(
        f"{pr['tool']}, on the API and the worker while {pr['tasks']} fast tasks arrive "
        f"open-loop at {pr['rate']:.1f}/s (50 % of the case's saturated rate, so that the "
        f"processes seldom wait for a core; {pr['tasks_per_s']:.1f} tasks/s done; a run of "
        "its own, none of the measured ones). Own time "
        + (
            "= samples whose innermost Python frame is the function (time in C code called "
            "from it counts there)"
            if unit == "samples"
            else "= cProfile's tottime"
        )
        + "; share of the process's total."
    )
    for role in ("api", "worker"):
        prof = pr.get(role)
        if not prof:
            continue
        add("")
        idle = prof.get("idle_ms")
        left = f"; {idle} ms waiting in epoll/select left out" if idle is not None else ""
        add(f"### {role} ({prof['samples']} {unit}{left})")
        add("")
        add(f"| # | function (file:first line) | own {unit} | share |")
        add("|---:|---|---:|---:|")
        for k, (name, n, share) in enumerate(prof["top"], 1):
            add(f"| {k} | `{name}` | {n} | {share:.1%} |")
        add("")
        add(
            "By package (own time): "
            + ", ".join(f"{name} {share:.0%}" for name, _, share in prof["packages"])
            + "."
        )
        if prof.get("ponder"):
            add("")
            add(
                "By the innermost frame of ponder's own code on the stack (which ponder "
                "function the time is spent under, libraries included): "
                + ", ".join(f"`{name}` {share:.0%}" for name, _, share in prof["ponder"])
                + "."
            )


def plot(bench: Bench, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, dict[str, float]]] = []
    for p in bench.phases:
        if p.loop in ("closed", "version"):
            c = p.cpu_ms_per_task
            parts = {
                "api / serve": c.get("api", c.get("serve", 0.0)),
                "worker": c.get("worker", 0.0),
                "redis-server": c.get("redis", 0.0),
                "client": c["client"],
            }
            label = p.case.replace(", ", "\n", 1).replace("standard-5", "std-5")
            if p.loop == "version":  # "split, scripted @ <commit>, fast"
                label = "fast @\n" + p.case.split("@ ")[1].split(",")[0]
            bars.append((label, parts))
    for a in bench.arq:
        c = a["cpu_ms_per_job"]
        bars.append(
            (
                f"arq no-op\n({a['label']})",
                {"api / serve": 0.0, "worker": c["worker"], "redis-server": c["redis"],
                 "client": c["client"]},
            )
        )  # fmt: skip
    colors = {"api / serve": "#4c72b0", "worker": "#dd8452", "redis-server": "#c44e52",
              "client": "#bbbbbb"}  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(bars)), 5))
    xs = range(len(bars))
    bottom = [0.0] * len(bars)
    for part, color in colors.items():
        values = [b[1][part] for b in bars]
        ax.bar(xs, values, bottom=bottom, color=color, label=part,
               hatch="//" if part == "client" else None, edgecolor="white")  # fmt: skip
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for x, (_, parts) in zip(xs, bars, strict=True):
        service = sum(v for k, v in parts.items() if k != "client")
        ax.text(x, sum(parts.values()) + 0.1, f"{service:.1f}", ha="center", fontsize=8)
    ax.axhline(2.5, color="green", ls="--", lw=1, label="goal: scripted fast 2.5 ms")
    ax.axhline(4.0, color="purple", ls=":", lw=1, label="goal: openai fast 4 ms")
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("CPU ms per task (closed loop)")
    ax.set_title("ponder's CPU per task by process (number: service = ponder + redis-server)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=None, help="tasks per measured case (600)")
    p.add_argument("--quick", action="store_true", help="a smoke run: ~60 tasks a case")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--poll-ms", type=float, default=50.0)
    p.add_argument("--arq-jobs", type=int, default=None, help="arq jobs per run (2000)")
    p.add_argument("--arq-poll-delay-ms", type=float, default=10.0)
    p.add_argument("--arq-max-jobs", type=int, default=16)
    p.add_argument("--standin-delay", type=float, default=0.2, help="seconds a request")
    p.add_argument("--standin-slots", type=int, default=16, help="requests at once")
    p.add_argument(
        "--capacity-slots",
        type=int,
        default=8,
        help="the capacity test's stand-in: requests at once (8 x 0.2 s: 40/s)",
    )
    p.add_argument(
        "--capacity-clients", type=int, default=None, help="capacity test clients (3 x slots)"
    )
    p.add_argument("--scale-rounds", type=int, default=None, help="1+1 / 2+2 rounds (2)")
    p.add_argument(
        "--versions",
        default="",
        help="comma-separated commits to compare, interleaved, on the split scripted fast "
        "case (each from its own git archive of src/; the 'versions' part; none by default)",
    )
    p.add_argument("--version-rounds", type=int, default=4, help="rounds over --versions (4)")
    p.add_argument(
        "--version-cases",
        default="split:scripted:fast",
        help="comma-separated cases the versions part runs, each DEPLOYMENT:ENGINE:MODE "
        "(split|embedded : scripted|openai : fast|standard-5|fast+sse|standard-5+sse); "
        "default split:scripted:fast",
    )
    p.add_argument("--cprofile", action="store_true", help="profile with cProfile, not py-spy")
    p.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run (for development; default all: {','.join(PARTS)})",
    )
    p.add_argument(
        "--at-commit",
        metavar="REV",
        help="run ponder from this commit's src/ (a git archive), not the working tree's",
    )
    p.add_argument("--out", type=Path, default=None, help="report path without suffix")
    return p.parse_args(argv)


def version_cases(text: str) -> tuple[tuple[str, str, str], ...]:
    """``--version-cases``: ``split:scripted:fast,...`` as (deployment, engine, mode)s."""
    cases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        parts = item.split(":")
        if (
            len(parts) != 3
            or parts[0] not in ("split", "embedded")
            or parts[1] not in ("scripted", "openai")
            or parts[2].removesuffix(SSE) not in ("fast", "standard-5")
        ):
            raise SystemExit(
                f"--version-cases: {item!r} is not DEPLOYMENT:ENGINE:MODE, e.g. "
                "split:scripted:fast or embedded:openai:standard-5+sse"
            )
        cases.append((parts[0], parts[1], parts[2]))
    return tuple(cases)


async def amain(args: argparse.Namespace) -> int:
    tasks = args.tasks or (60 if args.quick else 600)
    s = Settings(
        tasks=tasks,
        clients=args.clients,
        poll_s=args.poll_ms / 1000,
        warmup=max(2 * args.clients, tasks // 10),
        arq_jobs=args.arq_jobs or (200 if args.quick else 2000),
        arq_poll_delay_s=args.arq_poll_delay_ms / 1000,
        arq_max_jobs=args.arq_max_jobs,
        standin_delay_s=args.standin_delay,
        standin_slots=args.standin_slots,
        capacity_clients=args.capacity_clients or 3 * args.capacity_slots,
        capacity_slots=args.capacity_slots,
        capacity_tasks=2 * tasks,
        profile_tasks=2 * tasks,
        scale_rounds=args.scale_rounds or (1 if args.quick else 2),
        versions=tuple(v for v in args.versions.split(",") if v),
        version_rounds=args.version_rounds,
        version_cases=version_cases(args.version_cases),
        cprofile=args.cprofile,
        parts=tuple(part for part in args.only.split(",") if part),
    )
    if unknown := set(s.parts) - set(PARTS):
        raise SystemExit(f"--only: unknown parts {sorted(unknown)}; choose from {PARTS}")
    out = args.out or (
        Path(tempfile.gettempdir()) / "overhead-quick" if args.quick else RESULTS / "overhead"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    head, dirty = code_version()
    # the versions part's rounds of this commit count towards the goals
    s.code_commit = "" if dirty else head
    meta: dict[str, Any] = {
        "command": " ".join(["python", "bench/overhead.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "code": (head or "unknown") + (" + uncommitted changes in src/" if dirty else ""),
        "machine": machine(),
        "packages": package_versions(),
        "load_start": load1(),
        "settings": asdict(s),
    }
    # SIGTERM and SIGINT (ignored in background jobs otherwise) cancel the run: the
    # finally blocks then stop every process it started
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="ponder-overhead-"))
    if args.at_commit:
        global PONDER_SRC
        commit = checkout(args.at_commit, workdir / "checkout")
        PONDER_SRC = workdir / "checkout" / "src"
        meta["code"] = f"{commit} (its src/, by git archive: `--at-commit`)"
        s.code_commit = commit
    try:
        bench = await run_all(s, workdir)
    except BaseException:
        log(f"failed; logs kept in {workdir}")
        raise
    meta["load_end"] = load1()
    meta["wall_s"] = time.monotonic() - t0
    png = out.with_suffix(".png")
    plot(bench, png)
    report = render(bench, meta, png)
    out.with_suffix(".md").write_text(report)
    raw = {
        **meta,
        "notes": bench.notes,
        "phases": [asdict(p) for p in bench.phases],
        "arq": bench.arq,
        "profile": bench.profile,
        "redis_commandstats": bench.commandstats,
        "redis_benchmark": bench.redis_bench,
        "goals": goals(bench),
    }
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"wrote {out.with_suffix('.md')}, .png, .json")
    return 0


def check_commits(args: argparse.Namespace) -> None:
    """Each ``--versions`` and ``--at-commit`` commit is one of this checkout's: checked
    before the run, not when the versions part comes (~10 min in)."""
    versions = args.versions.split(",") if "versions" in args.only.split(",") else []
    for rev in filter(None, [*versions, args.at_commit]):
        if commit_of(rev) is None:
            raise SystemExit(
                f"{rev!r} is not a commit of this checkout (a shallow clone lacks old ones: "
                "git fetch --unshallow); give --versions and --at-commit commits it has"
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    check_commits(args)
    try:
        return asyncio.run(amain(args))
    except asyncio.CancelledError:
        log("stopped by a signal; every process it started is stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
