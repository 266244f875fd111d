"""The service leg of ``bench/engine.py``: ``ponder serve`` on the openvino engine, measured
from an HTTP client.

``bench/engine.py`` runs :func:`service_worker` as one of its legs (``--only service``), in
a process of its own, once per repeat: each repeat starts a fresh ``ponder serve`` (a new
engine process, an empty prefix cache). ``ponder serve`` runs as a subprocess with
``PONDER_ENGINE=openvino``, ``PONDER_ENGINE_THREADS`` = the benchmark's threads,
``PONDER_ENGINE_MAX_ROWS=32``, the embedded SQLite store in a temporary directory and a
free port; everything else is the service's default (weights, KV cache, prefix cache,
delta events). Once ``/healthz`` and ``/readyz`` answer and a warm-up task is done, an
``httpx`` client measures:

- **burst**: 16 concurrent ``mode: fast`` tasks, greedy, ``max_new_tokens`` 64 (the
  benchmark's ``--new-tokens``), distinct prompts: completion tokens/s = the tasks'
  completion tokens over the wall time from the first submit to the last result
  (``bench/engine.py`` sets it against the bare pipeline's tokens/s at 16 rows from the
  same run);
- **short beside an essay**: a 16-token task alone, then another (a distinct prompt of
  the same length) sent 2 s after a 600-token essay task started running: each one's
  time from its submit to its terminal event;
- **healthz**: ``GET /healthz`` every 20 ms from a thread of its own while 32 concurrent
  128-token tasks run (from the last submit to the last result): latency p50 / p99 / max.

A task's end is the end of its event stream (``/v1/tasks/{id}/events?deltas=false``,
which closes after the terminal event); its tokens come from ``GET /v1/tasks/{id}``
(``usage``). Every prompt starts with a tag of its own, so no task reuses another's
cached prefill. The service's peak RSS is ``ponder serve``'s VmHWM plus its engine
process's, read at the end.

Standalone: ``.venv/bin/python bench/engine_service.py [--model M] [--threads N]`` prints
the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: rows of the service's engine (PONDER_ENGINE_MAX_ROWS)
MAX_ROWS = 32
BURST_TASKS, BURST_TOKENS = 16, 64
SHORT_TOKENS, ESSAY_TOKENS, ESSAY_HEAD_START_S = 16, 600, 2.0
HEALTH_TASKS, HEALTH_TOKENS, HEALTH_PERIOD_S = 32, 128, 0.020
#: a task's time limit in the service (the modes' defaults would end a slow run's tasks)
TASK_TIMEOUT_S = 1800
ESSAY = (
    "Write a very long essay, at least 1,500 words, on the history of the bicycle: its "
    "inventors, the materials, the races, the cities that changed for it, and its future. "
    "Use many paragraphs."
)
SHORT = "Name three colours of the rainbow, in one short sentence."
#: story prompts when the caller gives none (bench/engine.py passes its own)
STORIES = [
    f"Write a long, detailed story about {s}. Describe the place, the weather, the sounds "
    "and the people around, and end with a surprise."
    for s in ("a brave dragon", "a lost robot", "a lighthouse keeper", "a talking cat")
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def tagged(tag: str, text: str) -> str:
    """``text`` made distinct by a tag at its start (see bench/engine.py's ``tagged``)."""
    return f"[{tag}] {text}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vm_hwm_gb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), GB; 0 when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return int(status.split("VmHWM:")[1].split()[0]) / 2**20


def children(pid: int) -> list[int]:
    """The pids of a process's children, and theirs."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += [int(child), *children(int(child))]
    return found


class Server:
    """``ponder serve`` in a subprocess, its output in a log file."""

    def __init__(self, workdir: Path, model: str, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "ponder-serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
        if "PONDER_MODEL_CACHE_DIR" in os.environ:  # the cache the other legs read
            env["PONDER_MODEL_CACHE_DIR"] = os.environ["PONDER_MODEL_CACHE_DIR"]
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PONDER_ENGINE="openvino",
            PONDER_MODEL=model,
            PONDER_ENGINE_THREADS=str(threads),
            PONDER_ENGINE_MAX_ROWS=str(MAX_ROWS),
            PONDER_SQLITE_PATH=str(workdir / "ponder.db"),
            PONDER_PORT=str(self.port),
            PONDER_WORKER_MAX_TASKS=str(2 * MAX_ROWS),
            PONDER_LOG_LEVEL="warning",
        )
        for mode in ("FAST", "STANDARD", "DEEP"):
            for name in ("SAMPLE_TIMEOUT_S", "TASK_TIMEOUT_S", "MAX_TIMEOUT_S"):
                env[f"PONDER_MODES__{mode}__{name}"] = str(TASK_TIMEOUT_S)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        ponder = Path(sys.executable).parent / "ponder"
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(ponder), "serve", "--port", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.log_path.parent,
            )

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def wait_ready(self, timeout_s: float = 900) -> float:
        """Seconds until /healthz and then /readyz answer 200."""
        import httpx

        started = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            for route in ("/healthz", "/readyz"):
                while True:
                    if self.proc is not None and self.proc.poll() is not None:
                        raise RuntimeError(
                            f"ponder serve exited with {self.proc.returncode}: {self.log_tail()}"
                        )
                    if time.monotonic() - started > timeout_s:
                        raise RuntimeError(f"ponder serve: no 200 from {route}: {self.log_tail()}")
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(route)).status_code == 200:
                            break
                    await asyncio.sleep(0.2)
        return time.monotonic() - started

    def peak_rss_gb(self) -> tuple[float, float]:
        """(ponder serve's VmHWM, its children's: the engine process), GB."""
        if self.proc is None:
            return 0.0, 0.0
        pid = self.proc.pid
        return vm_hwm_gb(pid), sum(vm_hwm_gb(c) for c in children(pid))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Client:
    """Tasks through the HTTP API: submit, follow to the end, read."""

    def __init__(self, http: Any) -> None:
        self.http = http

    async def submit(self, prompt: str, max_new_tokens: int) -> str:
        body = {
            "prompt": prompt,
            "mode": "fast",
            "task_type": "text",
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
        }
        response = await self.http.post("/v1/tasks", json=body)
        if response.status_code not in (200, 202):
            raise RuntimeError(f"POST /v1/tasks: {response.status_code} {response.text[:300]}")
        task_id: str = response.json()["id"]
        return task_id

    async def follow(self, task_id: str, running: asyncio.Event | None = None) -> float:
        """Read the task's events to the end of the stream (after the terminal event); the
        perf_counter time it ended. ``running`` is set at the task's ``running`` status."""
        url = f"/v1/tasks/{task_id}/events"
        async with self.http.stream("GET", url, params={"deltas": "false"}) as response:
            async for line in response.aiter_lines():
                if running is not None and line.startswith("data:") and '"running"' in line:
                    running.set()
        return time.perf_counter()

    async def read(self, task_id: str) -> dict[str, Any]:
        task: dict[str, Any] = (await self.http.get(f"/v1/tasks/{task_id}")).json()
        if task["status"] not in ("done", "partial_done"):
            raise RuntimeError(f"task {task_id} ended {task['status']}: {task.get('error')}")
        return task

    async def run(self, prompt: str, max_new_tokens: int) -> tuple[float, dict[str, Any]]:
        """Submit one task and wait for it: (seconds from submit to its end, the task)."""
        started = time.perf_counter()
        task_id = await self.submit(prompt, max_new_tokens)
        ended = await self.follow(task_id)
        return ended - started, await self.read(task_id)

    async def many(self, prompts: list[str], max_new_tokens: int) -> tuple[float, list[Any]]:
        """Submit every prompt at once: (seconds from the first submit to the last end, the
        tasks)."""
        started = time.perf_counter()
        ids = await asyncio.gather(*(self.submit(p, max_new_tokens) for p in prompts))
        ends = await asyncio.gather(*(self.follow(i) for i in ids))
        tasks = await asyncio.gather(*(self.read(i) for i in ids))
        return max(ends) - started, list(tasks)


def _healthz(url: str, stop: threading.Event, latencies: list[float]) -> None:
    """GET /healthz every HEALTH_PERIOD_S (on a fixed schedule) until ``stop``."""
    import httpx

    with httpx.Client(base_url=url, timeout=10) as http:
        due = time.perf_counter()
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/healthz").raise_for_status()
            latencies.append(time.perf_counter() - started)
            due += HEALTH_PERIOD_S
            now = time.perf_counter()
            if due < now:  # a slow answer: the next one at once, the schedule from now
                due = now
            time.sleep(due - now)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(job: dict[str, Any], server: Server) -> dict[str, Any]:
    import httpx

    stories: list[str] = job.get("stories") or STORIES
    story = [stories[i % len(stories)] for i in range(max(BURST_TASKS, HEALTH_TASKS))]
    timeout = httpx.Timeout(TASK_TIMEOUT_S, connect=10)
    limits = httpx.Limits(max_connections=4 * HEALTH_TASKS)
    result: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=timeout, limits=limits) as http:
        client = Client(http)
        await client.run(tagged("warm-up", SHORT), 4)

        burst_tokens = job.get("new_tokens", BURST_TOKENS)
        seconds, tasks = await client.many(
            [tagged(f"burst {i}", story[i]) for i in range(BURST_TASKS)], burst_tokens
        )
        result["burst"] = {
            "max_new_tokens": burst_tokens,
            "seconds": seconds,
            "tokens": sum(t["usage"]["completion_tokens"] for t in tasks),
            "prompt_tokens": sum(t["usage"]["prompt_tokens"] for t in tasks),
            "tasks": len(tasks),
        }
        log(f"  service burst: {result['burst']['tokens'] / seconds:6.1f} tok/s")

        seconds, task = await client.run(tagged("alone", SHORT), SHORT_TOKENS)
        result["short_alone"] = {"seconds": seconds, "tokens": task["usage"]["completion_tokens"]}
        running = asyncio.Event()
        essay_started = time.perf_counter()
        essay_id = await client.submit(tagged("essay", ESSAY), ESSAY_TOKENS)
        essay_end = asyncio.ensure_future(client.follow(essay_id, running))
        await asyncio.wait_for(running.wait(), TASK_TIMEOUT_S)
        await asyncio.sleep(ESSAY_HEAD_START_S)
        sent = time.perf_counter()
        seconds, task = await client.run(tagged("beside", SHORT), SHORT_TOKENS)
        short_end = sent + seconds
        essay_ended = await essay_end
        essay = await client.read(essay_id)
        result["short_beside_essay"] = {
            "seconds": seconds,
            "tokens": task["usage"]["completion_tokens"],
            "essay_tokens": essay["usage"]["completion_tokens"],
            "essay_seconds": essay_ended - essay_started,
            "essay_running_after": essay_ended > short_end,
        }
        log(
            f"  service 16-token answer: {result['short_alone']['seconds']:.2f} s alone, "
            f"{seconds:.2f} s beside the essay"
        )

        stop, latencies = threading.Event(), []
        sampler = threading.Thread(target=_healthz, args=(server.url, stop, latencies))
        prompts = [tagged(f"load {i}", story[i]) for i in range(HEALTH_TASKS)]
        started = time.perf_counter()
        ids = await asyncio.gather(*(client.submit(p, HEALTH_TOKENS) for p in prompts))
        sampler.start()
        try:
            ends = await asyncio.gather(*(client.follow(i) for i in ids))
        finally:
            stop.set()
            sampler.join()
        tasks = await asyncio.gather(*(client.read(i) for i in ids))
        result["healthz"] = {
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * _quantile(latencies, 0.99),
            "max_ms": 1000 * max(latencies),
            "samples": len(latencies),
            "seconds": max(ends) - started,
            "tokens": sum(t["usage"]["completion_tokens"] for t in tasks),
        }
        log(
            f"  service /healthz under {HEALTH_TASKS} rows: p50 "
            f"{result['healthz']['p50_ms']:.1f} ms, p99 {result['healthz']['p99_ms']:.1f} ms"
        )
    return result


def service_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The service's figures (see the module docstring); runs in .venv."""
    with tempfile.TemporaryDirectory(prefix="ponder-bench-service-") as tmp:
        server = Server(Path(tmp), job["model"], job["threads"])
        server.start()
        try:
            ready_s = asyncio.run(server.wait_ready())
            result = asyncio.run(measure(job, server))
            serve_rss, engine_rss = server.peak_rss_gb()
        except BaseException:
            log(f"  ponder serve's log: {server.log_tail()}")
            raise
        finally:
            server.stop()
    result.update(
        ready_s=ready_s,
        serve_peak_rss_gb=serve_rss,
        engine_peak_rss_gb=engine_rss,
        peak_rss_gb=serve_rss + engine_rss,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(service_worker({"model": args.model, "threads": args.threads}), indent=1))


if __name__ == "__main__":
    main()
