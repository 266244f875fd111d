"""What more than one benchmark uses: processes (a subprocess wrapper: stderr to a log
file, stopped by a signal then SIGKILL, reaped; a redis-server of the run's own; ``ponder
api`` and ``ponder worker`` over it, and the readiness wait), a free loopback port, the
stand-in OpenAI-compatible server, the percentile the reports use, the machine's load
average and description, the commit measured, and where the reports go.

The scripts import it as a sibling module (``bench/`` is first on ``sys.path`` when one of
them runs as ``python bench/<script>.py``). It imports nothing outside the standard library
at import time (``httpx`` and ``redis`` where a helper needs them), so that a benchmark run
in a peers' virtualenv can import it too. ``python bench/harness.py --as-worker LOG`` runs
``ponder worker`` with a line per engine sample in ``LOG`` (see :func:`run_as_worker`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TERMINAL = {"done", "partial_done", "failed", "cancelled", "expired"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    """The value at rank ``round(q% of (n - 1))`` of the sorted values; NaN if none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


class Proc:
    """A subprocess of a run, its stderr appended to ``<logdir>/<name>.log``. Every one
    started stays in ``Proc.running`` until stopped or killed: ``stop_all`` stops the rest
    at the end of a run."""

    running: ClassVar[list[Proc]] = []

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], logdir: Path):
        self.name = name
        self.argv = list(argv)
        #: the whole environment of the process (not added to this one's)
        self.env = env
        self.log_path = logdir / f"{name}.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, stdout: int | None = asyncio.subprocess.DEVNULL) -> Proc:
        with self.log_path.open("ab") as logf:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=stdout, stderr=logf
            )
        Proc.running.append(self)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        """Its exit code, once it exits."""
        assert self.proc is not None
        return await self.proc.wait()

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def kill(self) -> None:
        """SIGKILL it (a crash) and reap it."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(ValueError):
            Proc.running.remove(self)

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int | None:
        """Send ``sig``, SIGKILL it if it has not exited within ``timeout_s``, reap it;
        return its exit status (None if it never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(ValueError):
            Proc.running.remove(self)
        return self.proc.returncode

    @classmethod
    async def stop_all(cls) -> None:
        for p in list(reversed(cls.running)):
            await p.stop(timeout_s=10)


# A stand-in OpenAI-compatible server, run as ``python -c STAND_IN PORT DELAY_S SLOTS``:
# plain asyncio HTTP/1.1 (keep-alive, Content-Length bodies), so that its own CPU stays
# small; every ``POST .../chat/completions`` is answered after DELAY_S seconds, at most SLOTS
# at once (the others wait in line): capacity SLOTS / DELAY_S requests/s. A body with
# ``stream: true`` is answered as vLLM and OpenAI do: ``chat.completion.chunk`` events, one
# per token and choice, a last one with the finish reason, the usage when
# ``stream_options.include_usage`` asks, then ``data: [DONE]`` (sent together, after the
# delay). ``GET /stats``: requests in flight now, their peak, requests served, requests
# streamed and choices answered.
STAND_IN = r"""
import asyncio, json, sys
port, delay, slots = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
gate = asyncio.Semaphore(slots)
state = {"now": 0, "peak": 0, "served": 0, "streamed": 0, "choices": 0}
TOKENS = ["The", " answer", " is", " 4", "."]

def answer(body):
    n = int(body.get("n") or 1)
    state["choices"] += n
    usage = {"prompt_tokens": 10, "completion_tokens": len(TOKENS) * n,
             "total_tokens": 10 + len(TOKENS) * n}
    head = {"id": "chatcmpl-stand-in", "model": body.get("model")}
    if not body.get("stream"):
        return b"application/json", json.dumps({
            **head, "object": "chat.completion",
            "choices": [{"index": i, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "".join(TOKENS)}}
                        for i in range(n)],
            "usage": usage}).encode()
    state["streamed"] += 1
    head["object"] = "chat.completion.chunk"
    def event(choices, **extra):
        return "data: " + json.dumps({**head, "choices": choices, **extra}) + "\n\n"
    events = [event([{"index": i, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None} for i in range(n)])]
    events += [event([{"index": i, "delta": {"content": t}, "finish_reason": None}])
               for t in TOKENS for i in range(n)]
    events.append(event([{"index": i, "delta": {}, "finish_reason": "stop"} for i in range(n)]))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(event([], usage=usage))
    events.append("data: [DONE]\n\n")
    return b"text/event-stream", "".join(events).encode()

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if path.endswith("/chat/completions"):
                async with gate:
                    state["now"] += 1
                    state["peak"] = max(state["peak"], state["now"])
                    try:
                        await asyncio.sleep(delay)
                    finally:
                        state["now"] -= 1
                    state["served"] += 1
                (kind, payload), status = answer(json.loads(body)), b"200 OK"
            elif path == "/stats":
                kind, payload, status = b"application/json", json.dumps(state).encode(), b"200 OK"
            else:
                kind, payload = b"application/json", b'{"error": "not found"}'
                status = b"404 Not Found"
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: " + kind + b"\r\n"
                         b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


# --- ponder processes over a redis-server of the run's own ------------------------------


class RedisProc:
    """A redis-server of this run's own (never the machine's shared one)."""

    def __init__(self, workdir: Path, *, aof: bool) -> None:
        self.workdir = workdir
        self.aof = aof
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> float:
        """Start it; return the seconds until it answers (AOF loaded)."""
        import redis.asyncio as aioredis

        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with (self.workdir / "redis.log").open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--protected-mode", "no",
                "--appendonly", "yes" if self.aof else "no", "--appendfsync", "always",
                stdout=log, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        client = aioredis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                with contextlib.suppress(aioredis.ConnectionError, aioredis.BusyLoadingError):
                    if await client.ping():
                        return time.monotonic() - t0
                if time.monotonic() - t0 > 30:
                    raise RuntimeError("redis-server did not answer within 30 s")
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    async def version(self) -> str:
        """The server's ``redis_version``."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url, decode_responses=True)
        try:
            info = await client.info("server")
            return str(info.get("redis_version", "?"))
        finally:
            await client.aclose()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.proc = None


def ponder_env(redis_url: str, prefix: str, **settings: object) -> dict[str, str]:
    """This environment with ponder's settings for the run."""
    env = dict(os.environ)
    env |= {
        "PONDER_REDIS_URL": redis_url,
        "PONDER_KEY_PREFIX": prefix,
        "PONDER_ENGINE": "scripted",
        "PONDER_API_KEYS": "",
        "PONDER_LOG_LEVEL": "WARNING",
    }
    env.update({f"PONDER_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def api_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "ponder.cli", "api", "--host", "127.0.0.1", "--port", str(port)]


def worker_argv(engine_log: Path | None = None) -> list[str]:
    """``ponder worker``; with ``engine_log``, run through this file (:func:`run_as_worker`)."""
    if engine_log is None:
        return [sys.executable, "-m", "ponder.cli", "worker"]
    return [sys.executable, str(Path(__file__).resolve()), "--as-worker", str(engine_log)]


def run_as_worker(engine_log: str) -> None:
    """``ponder worker``, plus a line per sample handed to the engine (``S time task
    index``), one per sample it returns (``F time task index``) and one per sample the
    worker tells it to stop (``C time task index``)."""
    from ponder.cli import app
    from ponder.engines.scripted import ScriptedEngine

    fd = os.open(engine_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    submit = ScriptedEngine.submit

    def line(kind: str, request: Any) -> None:
        os.write(
            fd, f"{kind} {time.time():.6f} {request.task_id} {request.sample_index}\n".encode()
        )

    async def logged(self: ScriptedEngine, request: Any) -> Any:
        request.on_cancel(functools.partial(line, "C", request))
        line("S", request)
        out = await submit(self, request)
        line("F", request)
        return out

    ScriptedEngine.submit = logged  # type: ignore[method-assign]
    sys.argv = ["ponder", "worker"]
    app()


async def wait_ready(url: str, workers: int, timeout_s: float = 60) -> None:
    """Until /readyz says ready with ``workers`` live workers."""
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await c.get("/readyz")
                if r.status_code == 200 and r.json()["workers"] >= workers:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster was not ready within {timeout_s} s")
            await asyncio.sleep(0.1)


class Cluster:
    """A run's own redis-server (``redis``), the folder of its logs (``logdir``) and the
    ``ponder`` processes to start over it: an ``api`` on a free loopback port (``url``) and
    workers, each with the run's key ``prefix``. The processes are made, not started."""

    def __init__(self, logdir: Path, redis: RedisProc, prefix: str) -> None:
        self.logdir = logdir
        self.redis = redis
        self.prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def ready(self, workers: int, timeout_s: float = 60) -> None:
        """Until the api says ready with ``workers`` live workers (:func:`wait_ready`)."""
        await wait_ready(self.url, workers, timeout_s)

    def env(self, node_id: str, **settings: object) -> dict[str, str]:
        return ponder_env(self.redis.url, self.prefix, node_id=node_id, **settings)

    def api(self, **settings: object) -> Proc:
        """``ponder api`` (node id ``api1``, log ``api.log``)."""
        return Proc("api", api_argv(self.port), self.env("api1", **settings), self.logdir)

    def worker(self, name: str, engine_log: Path | None = None, **settings: object) -> Proc:
        """``ponder worker`` with node id ``name`` (log ``<name>.log``); with ``engine_log``,
        the engine's samples logged there (:func:`run_as_worker`)."""
        env = self.env(name, **settings)
        return Proc(name, worker_argv(engine_log), env, self.logdir)


@contextlib.asynccontextmanager
async def own_cluster(prefix: str, keep_logs: bool, *, aof: bool = False) -> AsyncIterator[Cluster]:
    """A :class:`Cluster` over a redis-server started in a fresh temporary folder (AOF with
    ``appendfsync always`` if ``aof``); Redis killed at the end, the folder removed unless
    ``keep_logs``."""
    async with cluster_logs(keep_logs) as tmp:
        redis_server = RedisProc(tmp / "redis", aof=aof)
        await redis_server.start()
        try:
            yield Cluster(tmp, redis_server, prefix)
        finally:
            await redis_server.kill()


@contextlib.asynccontextmanager
async def cluster_logs(keep: bool) -> AsyncIterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="ponder-bench-"))
    try:
        yield tmp
    finally:
        if keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --- reports ---------------------------------------------------------------------------


def environment() -> str:
    """The machine, Python and redis-py."""
    import redis

    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, redis-py {redis.__version__}"
    )


def code_version() -> str:
    """The commit the run measures (``--commit`` overrides, e.g. for a snapshot)."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "src")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in src/" if dirty else "")


def load_note(start: float, end: float) -> str:
    """The machine's 1-minute load average at the start and end of a run."""
    return (
        f"Machine load average (1 min) at start / end: {start:.1f} / {end:.1f} on "
        f"{os.cpu_count()} CPUs (the machine is shared: anything above the run's own "
        "processes is other work)."
    )


def report_head(
    command: str, commit: str, details: str, redis_ver: str, load: tuple[float, float]
) -> str:
    """The two paragraphs under a cluster benchmark's title: ``command`` (Markdown), the
    commit, ``details`` (seed, date), the machine and the Redis server; the load average at
    the run's start and end (:func:`load_note`)."""
    return (
        f"{command} at commit {commit}, {details}. {environment()}, redis-server {redis_ver}."
        f"\n\n{load_note(*load)}"
    )


def load_avg() -> str:
    """What ``uptime`` says ("?" if it cannot be run)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    return "?"


def parse_cluster_args(
    p: argparse.ArgumentParser, report: str, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``argv`` parsed with ``p``'s options and those of every cluster benchmark: ``--out``
    (``bench/results/<report>``), ``--keep-logs`` and ``--commit`` (the code version its
    report names; :func:`code_version` if not given)."""
    p.add_argument("--out", type=Path, default=RESULTS / report)
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument("--commit", default=None, help="the code version to name in the report")
    args = p.parse_args(argv)
    args.commit = args.commit or code_version()
    return args


def write_report(out: Path, report: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--as-worker":
        run_as_worker(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} --as-worker ENGINE_LOG")


_T = TypeVar("_T")


async def bounded(
    jobs: Sequence[Callable[[], Coroutine[Any, Any, _T]]], limit: int
) -> AsyncIterator[_T]:
    """Run ``jobs`` (each a coroutine function of no arguments) at most ``limit`` at once,
    in order; yield each result as its job ends. The jobs still running are cancelled when
    the caller stops early or an error ends the loop."""
    queue = list(jobs)
    pending: set[asyncio.Task[_T]] = set()
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                pending.add(asyncio.create_task(queue.pop(0)()))
            ended, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for job in ended:
                yield job.result()
    finally:
        for job in pending:
            job.cancel()
