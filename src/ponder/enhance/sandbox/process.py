"""Run a launched program as an asyncio subprocess, never blocking the event loop.

:func:`run_launch` feeds the child its stdin, reads stdout and stderr each up to
:data:`~ponder.enhance.sandbox.launch.OUTPUT_LIMIT_BYTES` (dropping the rest so the child
never blocks on a full pipe), enforces the wall-clock timeout and kills the child's whole
process group when it ends, times out or its caller is cancelled.
:func:`run_python_async` runs a program as ``__main__`` this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass

from ponder.enhance.sandbox.launch import (
    OUTPUT_LIMIT_BYTES,
    Isolation,
    IsolationMode,
    Launch,
    check_run_args,
    choose_isolation,
    kill_group,
    launching,
)

__all__ = ["SandboxResult", "run_launch", "run_python_async"]

#: how long to wait for the pipes to close after the process group is killed
_DRAIN_S = 2.0


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run. ``exit_code`` is negative (-signal) when the child was killed."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    #: True when stdout or stderr was cut at OUTPUT_LIMIT_BYTES
    truncated: bool = False
    isolation: Isolation = "rlimits"


class _CappedBuffer:
    def __init__(self) -> None:
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = OUTPUT_LIMIT_BYTES - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _result(
    out: _CappedBuffer,
    err: _CappedBuffer,
    returncode: int | None,
    timed_out: bool,
    isolation: Isolation,
) -> SandboxResult:
    return SandboxResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=returncode if returncode is not None else -int(signal.SIGKILL),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        isolation=isolation,
    )


async def _read_capped(stream: asyncio.StreamReader, buf: _CappedBuffer) -> None:
    while chunk := await stream.read(65536):
        buf.add(chunk)


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()


async def run_launch(launch: Launch, stdin: bytes, timeout_s: float) -> SandboxResult:
    out, err = _CappedBuffer(), _CappedBuffer()
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        cwd=launch.cwd,
        env=launch.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        pass_fds=launch.pass_fds,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    io_tasks = [
        asyncio.create_task(_feed(proc.stdin, stdin)),
        asyncio.create_task(_read_capped(proc.stdout, out)),
        asyncio.create_task(_read_capped(proc.stderr, err)),
    ]
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
    finally:
        # Runs on cancellation too: the child never outlives its caller.
        kill_group(proc.pid)
        try:
            await asyncio.shield(_reap(proc, io_tasks))
        finally:
            for task in io_tasks:
                task.cancel()
    return _result(out, err, proc.returncode, timed_out, launch.isolation)


async def _reap(proc: asyncio.subprocess.Process, io_tasks: list[asyncio.Task[None]]) -> None:
    await proc.wait()
    _done, pending = await asyncio.wait(io_tasks, timeout=_DRAIN_S)
    for task in pending:
        task.cancel()
    for task in io_tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a broken pipe on stdin is not an error here


async def run_python_async(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    stdin: str = "",
    isolation: IsolationMode = "auto",
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox (see the module docstring).

    The wall-clock ``timeout_s`` kills the whole process group; CPU time is limited to
    about the same. ``memory_mb`` bounds the address space (a big allocation raises
    ``MemoryError`` in the child). ``isolation``: see :func:`choose_isolation`. The event
    loop is never blocked; cancelling the awaiting task kills the process group and
    re-raises.
    """
    check_run_args(timeout_s, memory_mb, isolation)
    chosen = await asyncio.to_thread(choose_isolation, isolation)
    with launching(
        "run", {"main.py": code}, chosen, timeout_s=timeout_s, memory_mb=memory_mb
    ) as run:
        return await run_launch(run, stdin.encode("utf-8"), timeout_s)
