"""Run untrusted Python (program-of-thought code, code-task candidates) in a subprocess.

**This is a best-effort guard, not a security boundary.** It stops accidents and the
obvious (runaway loops, huge allocations, big files, ``socket`` use, stray children in the
process group), not a determined attacker: the code runs as the same user, sees the same
file system, and can reach the network through ``ctypes``, ``os.system`` or a child process
that has left the process group. Isolation needs OS help: a separate user, mount/network/
PID namespaces (``bwrap``, ``nsjail``, a container), seccomp filters, cgroups for memory.

What is done, per run:

* a fresh temporary directory is the working directory and ``HOME``; it is deleted after;
* the interpreter runs isolated (``python -I -B -X utf8``: no user site, no environment
  ``PYTHON*`` variables, no cwd on ``sys.path``) with a clean environment (no proxies);
* a bootstrap sets resource limits before any user code runs: ``RLIMIT_AS`` (memory),
  ``RLIMIT_CPU``, ``RLIMIT_NOFILE`` (64), ``RLIMIT_FSIZE`` (4 MiB), ``RLIMIT_CORE`` (0).
  They are set in the child itself rather than in ``preexec_fn``, which is unsafe in a
  multi-threaded parent (the worker is one);
* the bootstrap replaces ``_socket.socket`` (which ``socket.socket`` initialises through) with a
  class that refuses
  anything but ``AF_UNIX`` (so ``asyncio`` still works) and makes name resolution and
  ``create_connection`` raise;
* the child leads its own session; at the timeout, and after it exits, the whole process
  group is killed (SIGKILL);
* stdout and stderr are each capped at :data:`OUTPUT_LIMIT_BYTES`; the rest is read and
  dropped so the child never blocks on a full pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ponder.enhance.answers import extract_code_block

__all__ = [
    "OUTPUT_LIMIT_BYTES",
    "SandboxResult",
    "TestReport",
    "extract_program_output",
    "run_python",
    "run_python_async",
    "run_tests",
    "run_tests_async",
]

#: stdout and stderr are each cut at this many bytes
OUTPUT_LIMIT_BYTES = 64 * 1024
_FSIZE_LIMIT_BYTES = 4 * 1024 * 1024
_NOFILE_LIMIT = 64
#: how long to wait for the pipes to close after the process group is killed
_DRAIN_S = 2.0
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run. ``exit_code`` is negative (-signal) when the child was killed."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    #: True when stdout or stderr was cut at OUTPUT_LIMIT_BYTES
    truncated: bool = False


@dataclass(frozen=True)
class TestReport:
    """Counts of a test run; on a timeout, tests that did not report count as failed."""

    __test__ = False  # not a pytest test class

    passed: int
    failed: int
    errors: list[str] = field(default_factory=list)
    timed_out: bool = False


# The bootstrap: limits, network guard, then the user's code. Argument: the mode ("run" or
# "tests"). In "tests" mode the first stdin line is a nonce that prefixes the report lines.
_BOOTSTRAP = r"""
import sys, os, resource
_mem, _cpu, _nofile, _fsize = (int(x) for x in sys.argv[2:6])
for _lim, _val in ((resource.RLIMIT_AS, _mem), (resource.RLIMIT_CPU, _cpu),
                   (resource.RLIMIT_NOFILE, _nofile), (resource.RLIMIT_FSIZE, _fsize),
                   (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(_lim, (_val, _val))
import socket, _socket

_RealSocket = _socket.socket

class _NoNetworkSocket(_RealSocket):
    # socket.socket.__init__ calls _socket.socket.__init__ (looked up at call time), so
    # replacing _socket.socket guards both; AF_UNIX stays usable for asyncio's self-pipe.
    def __init__(self, *args, **kwargs):
        _RealSocket.__init__(self, *args, **kwargs)
        if self.family != socket.AF_UNIX:
            _RealSocket.close(self)
            raise PermissionError("network access is disabled in the ponder sandbox")

def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the ponder sandbox")

_socket.socket = _NoNetworkSocket
for _name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname",
              "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
    for _mod in (socket, _socket):
        if hasattr(_mod, _name):
            setattr(_mod, _name, _no_network)
del _name, _mod, _lim, _val

import builtins, json, traceback, inspect

def _source(name):
    with open(name, encoding="utf-8") as f:
        return compile(f.read(), name, "exec")

def _describe(exc):
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[:400]

if sys.argv[1] == "run":
    _code = _source("main.py")
    _ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(_code, _ns)
    except SystemExit:
        raise
    except BaseException as _e:
        traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
        sys.exit(1)
else:
    import ast, asyncio, io
    _nonce = sys.stdin.readline().strip()
    _out = sys.stdout
    sys.stdin = io.StringIO("")

    def _report(**item):
        _out.write(_nonce + " " + json.dumps(item) + "\n")
        _out.flush()

    with open("tests.py", encoding="utf-8") as f:
        _tests_src = f.read()
    _tree = ast.parse(_tests_src)
    _names = [n.name for n in _tree.body
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name.startswith("test")]
    _module_asserts = any(isinstance(n, ast.Assert)
                          for top in _tree.body
                          if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.ClassDef))
                          for n in ast.walk(top))
    _report(planned=len(_names) + (1 if _module_asserts or not _names else 0))
    _ns = {"__name__": "__ponder_test__", "__builtins__": builtins}
    sys.stdout = io.StringIO()
    try:
        exec(_source("candidate.py"), _ns)
    except BaseException as _e:
        _report(name="<candidate>", ok=False, error="candidate: " + _describe(_e))
        _report(done=True)
        sys.exit(0)
    try:
        exec(compile(_tree, "tests.py", "exec"), _ns)
    except BaseException as _e:
        _report(name="<module>", ok=False, error="tests.py: " + _describe(_e))
        _report(done=True)
        sys.exit(0)
    if _module_asserts or not _names:
        _report(name="<module>", ok=True)
    for _name in _names:
        _fn = _ns.get(_name)
        try:
            if inspect.iscoroutinefunction(_fn):
                asyncio.run(_fn())
            else:
                _fn()
        except BaseException as _e:
            _report(name=_name, ok=False, error=_name + ": " + _describe(_e))
        else:
            _report(name=_name, ok=True)
        sys.stdout = io.StringIO()
    _report(done=True)
"""


def _clean_env(tmpdir: str) -> dict[str, str]:
    # No proxies, no credentials, nothing inherited: only what an interpreter needs.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": tmpdir,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _argv(mode: str, *, timeout_s: float, memory_mb: int) -> list[str]:
    cpu_s = max(1, int(timeout_s) + 1)
    limits = [memory_mb * 1024 * 1024, cpu_s, _NOFILE_LIMIT, _FSIZE_LIMIT_BYTES]
    return [sys.executable, "-I", "-B", "-X", "utf8", "-c", _BOOTSTRAP, mode] + [
        str(x) for x in limits
    ]


def _check(timeout_s: float, memory_mb: int) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if memory_mb < 32:
        raise ValueError(
            f"memory_mb must be at least 32 (the interpreter needs it), got {memory_mb}"
        )


@contextlib.contextmanager
def _workdir(files: dict[str, str]) -> Iterator[str]:
    tmpdir = tempfile.mkdtemp(prefix="ponder-sandbox-")
    try:
        for name, content in files.items():
            Path(tmpdir, name).write_text(content, encoding="utf-8")
        yield tmpdir
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


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
    out: _CappedBuffer, err: _CappedBuffer, returncode: int | None, timed_out: bool
) -> SandboxResult:
    return SandboxResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=returncode if returncode is not None else -int(signal.SIGKILL),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )


# ---------------------------------------------------------------------------------------
# Blocking runner
# ---------------------------------------------------------------------------------------


def _pump_out(stream: IO[bytes], buf: _CappedBuffer) -> None:
    with contextlib.suppress(OSError, ValueError):
        fd = stream.fileno()
        while chunk := os.read(fd, 65536):
            buf.add(chunk)


def _pump_in(stream: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        if data:
            stream.write(data)
        stream.close()


def _run_blocking(argv: list[str], tmpdir: str, stdin: bytes, timeout_s: float) -> SandboxResult:
    out, err = _CappedBuffer(), _CappedBuffer()
    proc = subprocess.Popen(
        argv,
        cwd=tmpdir,
        env=_clean_env(tmpdir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    threads = [
        threading.Thread(target=_pump_in, args=(proc.stdin, stdin), daemon=True),
        threading.Thread(target=_pump_out, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_pump_out, args=(proc.stderr, err), daemon=True),
    ]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # also after a normal exit: children left in the group must not outlive the run
        _kill_group(proc.pid)
        proc.wait()
        deadline = time.monotonic() + _DRAIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
    return _result(out, err, proc.returncode, timed_out)


# ---------------------------------------------------------------------------------------
# Asyncio runner
# ---------------------------------------------------------------------------------------


async def _read_capped(stream: asyncio.StreamReader, buf: _CappedBuffer) -> None:
    while chunk := await stream.read(65536):
        buf.add(chunk)


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()


async def _run_async(argv: list[str], tmpdir: str, stdin: bytes, timeout_s: float) -> SandboxResult:
    out, err = _CappedBuffer(), _CappedBuffer()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmpdir,
        env=_clean_env(tmpdir),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
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
        _kill_group(proc.pid)
        try:
            await asyncio.shield(_reap(proc, io_tasks))
        finally:
            for task in io_tasks:
                task.cancel()
    return _result(out, err, proc.returncode, timed_out)


async def _reap(proc: asyncio.subprocess.Process, io_tasks: list[asyncio.Task[None]]) -> None:
    await proc.wait()
    _done, pending = await asyncio.wait(io_tasks, timeout=_DRAIN_S)
    for task in pending:
        task.cancel()
    for task in io_tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a broken pipe on stdin is not an error here


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    stdin: str = "",
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox (see the module docstring); blocking.

    The wall-clock ``timeout_s`` kills the whole process group; CPU time is limited to
    about the same. ``memory_mb`` bounds the address space (a big allocation raises
    ``MemoryError`` in the child). Do not call from an event loop: use
    :func:`run_python_async`.
    """
    _check(timeout_s, memory_mb)
    with _workdir({"main.py": code}) as tmpdir:
        argv = _argv("run", timeout_s=timeout_s, memory_mb=memory_mb)
        return _run_blocking(argv, tmpdir, stdin.encode("utf-8"), timeout_s)


async def run_python_async(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    stdin: str = "",
) -> SandboxResult:
    """:func:`run_python` on ``asyncio.create_subprocess_exec``: the loop is never blocked.

    Cancelling the awaiting task kills the process group and re-raises.
    """
    _check(timeout_s, memory_mb)
    with _workdir({"main.py": code}) as tmpdir:
        argv = _argv("run", timeout_s=timeout_s, memory_mb=memory_mb)
        return await _run_async(argv, tmpdir, stdin.encode("utf-8"), timeout_s)


def _test_report(result: SandboxResult, nonce: str, timeout_s: float) -> TestReport:
    planned: int | None = None
    passed = failed = 0
    errors: list[str] = []
    done = False
    prefix = nonce + " "
    for line in result.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            item: dict[str, Any] = json.loads(line[len(prefix) :])
        except ValueError:
            continue
        if "planned" in item:
            planned = int(item["planned"])
        elif item.get("done"):
            done = True
        elif item.get("ok"):
            passed += 1
        else:
            failed += 1
            if len(errors) < _MAX_ERRORS:
                errors.append(str(item.get("error", "failed"))[:_MAX_ERROR_CHARS])
    if not done:
        # Timed out, crashed (os._exit, a signal, MemoryError in the bootstrap) or the
        # report was cut: whatever did not report failed.
        failed += max(1, (planned or 0) - passed - failed)
        if result.timed_out:
            errors.append(f"timed out after {timeout_s:g} s")
        else:
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
            errors.append(f"the test run ended without a report: {tail[0][:_MAX_ERROR_CHARS]}")
    elif failed and planned is not None and passed + failed < planned:
        # the candidate (or the tests module) failed before any test could run
        failed = planned - passed
    return TestReport(passed=passed, failed=failed, errors=errors, timed_out=result.timed_out)


def _test_files(candidate: str, tests: str) -> dict[str, str]:
    return {"candidate.py": candidate, "tests.py": tests}


def run_tests(
    candidate: str, tests: str, *, timeout_s: float = 10.0, memory_mb: int = 256
) -> TestReport:
    """Run ``candidate`` then ``tests`` (plain Python) in one namespace in the sandbox.

    Each top-level ``test*`` function (sync or async) is one test. Top-level ``assert``
    statements together are one more test (and the only one when there are no test
    functions). Both files run with ``__name__ == "__ponder_test__"``, so a candidate's
    ``if __name__ == "__main__":`` block does not run. If the candidate or the tests
    module raises, every planned test fails. Output printed by the code is discarded.
    Blocking; see :func:`run_tests_async`.
    """
    _check(timeout_s, memory_mb)
    nonce = secrets.token_hex(16)
    with _workdir(_test_files(candidate, tests)) as tmpdir:
        argv = _argv("tests", timeout_s=timeout_s, memory_mb=memory_mb)
        result = _run_blocking(argv, tmpdir, (nonce + "\n").encode(), timeout_s)
    return _test_report(result, nonce, timeout_s)


async def run_tests_async(
    candidate: str, tests: str, *, timeout_s: float = 10.0, memory_mb: int = 256
) -> TestReport:
    """:func:`run_tests` without blocking the event loop."""
    _check(timeout_s, memory_mb)
    nonce = secrets.token_hex(16)
    with _workdir(_test_files(candidate, tests)) as tmpdir:
        argv = _argv("tests", timeout_s=timeout_s, memory_mb=memory_mb)
        result = await _run_async(argv, tmpdir, (nonce + "\n").encode(), timeout_s)
    return _test_report(result, nonce, timeout_s)


def extract_program_output(text: str) -> str | None:
    """The program in a model answer: its last fenced ``python`` block (an untagged block
    if none is tagged), or None."""
    return extract_code_block(text, python_only=True)
