"""What the benchmark scripts share to run their subprocesses: a free loopback port, a
subprocess wrapper (stderr to a log file, stopped by a signal then SIGKILL, reaped), a
stand-in OpenAI-compatible server; and the percentile their reports use.

The scripts import it as a sibling module (``bench/`` is first on ``sys.path`` when one of
them runs as ``python bench/<script>.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar


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
