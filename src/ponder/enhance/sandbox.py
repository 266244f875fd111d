"""Run untrusted Python (program-of-thought code, code-task candidates) in a subprocess.

Two isolations; each result says which one ran (``isolation``), and so does the sample.

**bwrap** (chosen when `bubblewrap <https://github.com/containers/bubblewrap>`_ is on
PATH and works). The program runs in new PID, network, IPC, UTS, mount (and cgroup,
where the kernel allows) namespaces. What it is guaranteed:

* no network: its network namespace has only a loopback interface of its own, so
  nothing on the host (Redis on 127.0.0.1, the API, the cloud metadata address) can be
  reached, whatever the code does (``ctypes``, a child interpreter);
* a read-only view of only what Python needs: the interpreter binary, its standard
  library and shared library, the environment's site-packages, the system shared
  libraries (``/usr/lib``, ``/lib*``), a fresh ``/proc`` of its own PID namespace and a
  minimal read-only ``/dev``. No host ``/etc``, ``/home``, ``/root`` (the interpreter's
  own directories excepted), ``/tmp``, ``/var`` or the service's files; the root is
  read-only;
* a private tmpfs work directory (``/sandbox``, also ``HOME`` and ``TMPDIR``) of at most
  :data:`WORKDIR_BYTES`, the only writable place, gone when the run ends;
* an unprivileged identity: as a normal user, a user namespace maps the caller to an
  unprivileged uid; as root, bwrap runs without a user namespace (root in one keeps
  capabilities over its own mounts and escapes ``RLIMIT_NPROC``) and the program drops to
  uid/gid 65534 (*nobody*) with no groups and no capabilities before any of its code runs;
* at most :data:`NPROC_LIMIT` processes and threads (``RLIMIT_NPROC``: per run in a user
  namespace; shared by every run of uid 65534 as root), so a fork bomb is contained;
* when the run ends (or times out, or its caller is cancelled) every process in it is
  killed: its PID namespace dies with it (``--die-with-parent``).

**rlimits** (without bwrap, or with ``PONDER_SANDBOX_ISOLATION=rlimits``): today's
best-effort guard, not a security boundary. It stops accidents and the obvious (runaway
loops, huge allocations, big files, ``socket`` use, stray children in the process group),
not a determined attacker: the code runs as the same user, sees (and can write) the same
file system, and can reach the network through ``ctypes``, ``os.system`` or a child
process; a fork bomb is bounded only by the timeout.

Both, per run:

* the interpreter runs isolated (``python -I -B -X utf8``: no user site, no environment
  ``PYTHON*`` variables, no cwd on ``sys.path``) with a clean environment (no proxies,
  no credentials); the working directory is fresh and is also ``HOME``;
* a bootstrap sets resource limits before any user code runs: ``RLIMIT_AS`` (memory),
  ``RLIMIT_CPU``, ``RLIMIT_NOFILE`` (64), ``RLIMIT_FSIZE`` (4 MiB), ``RLIMIT_CORE`` (0).
  They are set in the child itself rather than in ``preexec_fn``, which is unsafe in a
  multi-threaded parent (the worker is one);
* the bootstrap replaces ``_socket.socket`` (which ``socket.socket`` initialises through)
  with a class that refuses anything but ``AF_UNIX`` (so ``asyncio`` still works) and
  makes name resolution and ``create_connection`` raise;
* the child leads its own session; at the timeout, and after it exits, the whole process
  group is killed (SIGKILL);
* stdout and stderr are each capped at :data:`OUTPUT_LIMIT_BYTES`; the rest is read and
  dropped so the child never blocks on a full pipe.

Not guaranteed by either: a bound on memory across processes (each process has its own
``RLIMIT_AS``: at most :data:`NPROC_LIMIT` x ``memory_mb`` under bwrap; no cgroup limits),
protection from kernel exploits (there is no seccomp filter), or secrecy of what the
bound files contain (the interpreter, libraries and site-packages are readable).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ponder.enhance.answers import extract_code_block
from ponder.errors import PonderError

__all__ = [
    "NPROC_LIMIT",
    "OUTPUT_LIMIT_BYTES",
    "WORKDIR_BYTES",
    "Isolation",
    "IsolationMode",
    "SandboxResult",
    "SandboxUnavailable",
    "TestReport",
    "choose_isolation",
    "extract_program_output",
    "run_python_async",
    "run_tests_async",
]

log = logging.getLogger("ponder.sandbox")

#: which isolation ran: ``bwrap`` (namespaces) or ``rlimits`` (best effort)
Isolation = Literal["bwrap", "rlimits"]
#: what to run with: ``auto`` is bwrap when it works here, else rlimits
IsolationMode = Literal["auto", "bwrap", "rlimits"]

#: stdout and stderr are each cut at this many bytes
OUTPUT_LIMIT_BYTES = 64 * 1024
#: bwrap: processes and threads a run may have at once
NPROC_LIMIT = 16
#: bwrap: the size of the private work directory (a tmpfs, in memory)
WORKDIR_BYTES = 16 * 1024 * 1024
_FSIZE_LIMIT_BYTES = 4 * 1024 * 1024
_NOFILE_LIMIT = 64
#: bwrap: the work directory inside the sandbox, and the identity a root caller drops to
_SANDBOX_DIR = "/sandbox"
_NOBODY = 65534
_SYSTEM_LIBS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/libx32")
#: how long to wait for the pipes to close after the process group is killed
_DRAIN_S = 2.0
#: the longest the check that bwrap works may take
_PROBE_TIMEOUT_S = 10.0
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
    isolation: Isolation = "rlimits"


@dataclass(frozen=True)
class TestReport:
    """Counts of a test run; on a timeout, tests that did not report count as failed."""

    __test__ = False  # not a pytest test class

    passed: int
    failed: int
    errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    isolation: Isolation = "rlimits"


class SandboxUnavailable(PonderError):
    """``isolation="bwrap"`` was asked for and bwrap cannot run here (the message says why)."""


# The bootstrap: identity, limits, network guard, then the user's code. Arguments: the
# mode ("run" or "tests"), the limits, the uid to drop to (-1: stay), the process limit
# (-1: none), then site directories to add. In "tests" mode the first stdin line is a nonce
# that prefixes the report lines.
_BOOTSTRAP = r"""
import sys, os, resource
_mem, _cpu, _nofile, _fsize, _uid, _nproc = (int(x) for x in sys.argv[2:8])
if _uid >= 0:  # bwrap as root: become nobody (and lose every capability) first
    os.setgroups([])
    os.setgid(_uid)
    os.setuid(_uid)
_limits = [(resource.RLIMIT_AS, _mem), (resource.RLIMIT_CPU, _cpu),
           (resource.RLIMIT_NOFILE, _nofile), (resource.RLIMIT_FSIZE, _fsize),
           (resource.RLIMIT_CORE, 0)]
if _nproc >= 0:
    _limits.append((resource.RLIMIT_NPROC, _nproc))
for _lim, _val in _limits:
    resource.setrlimit(_lim, (_val, _val))
if sys.argv[8:]:
    import site
    for _dir in sys.argv[8:]:
        site.addsitedir(_dir)
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


_PYTHON_FLAGS = ("-I", "-B", "-X", "utf8")


def _clean_env(home: str) -> dict[str, str]:
    # No proxies, no credentials, nothing inherited: only what an interpreter needs.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _limits(timeout_s: float, memory_mb: int) -> list[str]:
    cpu_s = max(1, int(timeout_s) + 1)
    return [str(x) for x in (memory_mb * 1024 * 1024, cpu_s, _NOFILE_LIMIT, _FSIZE_LIMIT_BYTES)]


def _check(timeout_s: float, memory_mb: int, isolation: str) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if memory_mb < 32:
        raise ValueError(
            f"memory_mb must be at least 32 (the interpreter needs it), got {memory_mb}"
        )
    if isolation not in ("auto", "bwrap", "rlimits"):
        raise ValueError(f"isolation must be auto, bwrap or rlimits, got {isolation!r}")


@dataclass(frozen=True)
class _Launch:
    """How one run starts: the command, where, with what, and which isolation it is."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    isolation: Isolation
    pass_fds: tuple[int, ...] = ()


@functools.cache
def _python_layout() -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The interpreter binary, what it reads (bound read-only) and the site directories."""
    exe = os.path.realpath(sys.executable)
    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    paths = [exe, stdlib]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir, soname = sysconfig.get_config_vars("LIBDIR", "INSTSONAME")
        libpython = os.path.join(str(libdir), str(soname))
        if os.path.isfile(libpython):
            paths.append(os.path.realpath(libpython))
    found = (os.path.realpath(d) for d in site.getsitepackages() if os.path.isdir(d))
    sites = tuple(d for d in dict.fromkeys(found) if not d.startswith(stdlib + os.sep))
    return exe, (*paths, *sites), sites


def _bwrap_argv(mode: str, limits: list[str], files: dict[str, int]) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bwrap (bubblewrap) is not on PATH")
    exe, paths, sites = _python_layout()
    as_root = os.geteuid() == 0
    argv = [bwrap, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try"]
    if as_root:
        # No user namespace (see the module docstring): the bootstrap drops to nobody.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(_NOBODY), "--gid", str(_NOBODY)]
    argv += ["--size", str(WORKDIR_BYTES), "--perms", "0777", "--tmpfs", _SANDBOX_DIR]
    for name, fd in files.items():
        argv += ["--perms", "0644", "--file", str(fd), f"{_SANDBOX_DIR}/{name}"]
    binds = [lib for lib in _SYSTEM_LIBS if os.path.isdir(lib) and not os.path.islink(lib)]
    binds += paths
    # bwrap makes missing parents 0700, which the dropped identity could not traverse
    parents = {str(p) for path in binds for p in Path(path).parents if str(p) != "/"}
    for parent in sorted(parents, key=lambda p: p.count("/")):
        argv += ["--perms", "0755", "--dir", parent]
    for lib in _SYSTEM_LIBS:
        if os.path.islink(lib):
            argv += ["--symlink", os.readlink(lib), lib]
    for path in binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", _SANDBOX_DIR, exe, *_PYTHON_FLAGS, "-c", _BOOTSTRAP, mode, *limits]
    return [*argv, str(_NOBODY if as_root else -1), str(NPROC_LIMIT), *sites]


@contextlib.contextmanager
def _memfds(files: dict[str, str]) -> Iterator[dict[str, int]]:
    """Each file's content in an anonymous memory file (bwrap copies it into the tmpfs)."""
    fds: dict[str, int] = {}
    try:
        for name, content in files.items():
            fds[name] = fd = os.memfd_create(name)
            data = memoryview(content.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
            os.lseek(fd, 0, os.SEEK_SET)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


@contextlib.contextmanager
def _host_workdir(files: dict[str, str]) -> Iterator[str]:
    tmpdir = tempfile.mkdtemp(prefix="ponder-sandbox-")
    try:
        for name, content in files.items():
            Path(tmpdir, name).write_text(content, encoding="utf-8")
        yield tmpdir
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


@contextlib.contextmanager
def _launch(
    mode: str, files: dict[str, str], isolation: Isolation, *, timeout_s: float, memory_mb: int
) -> Iterator[_Launch]:
    limits = _limits(timeout_s, memory_mb)
    if isolation == "bwrap":
        with _memfds(files) as fds:
            argv = _bwrap_argv(mode, limits, fds)
            yield _Launch(argv, "/", _clean_env(_SANDBOX_DIR), "bwrap", tuple(fds.values()))
        return
    with _host_workdir(files) as tmpdir:
        argv = [sys.executable, *_PYTHON_FLAGS, "-c", _BOOTSTRAP, mode, *limits, "-1", "-1"]
        yield _Launch(argv, tmpdir, _clean_env(tmpdir), "rlimits")


def _probe_bwrap() -> tuple[int, str]:
    """Run ``pass`` under bwrap, blocking (once per process): its exit code and stderr."""
    with _launch("run", {"main.py": "pass"}, "bwrap", timeout_s=10, memory_mb=256) as probe:
        proc = subprocess.Popen(
            probe.argv,
            cwd=probe.cwd,
            env=probe.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=probe.pass_fds,
        )
        try:
            _, stderr = proc.communicate(timeout=_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            _, stderr = proc.communicate()
    return proc.returncode, stderr[:OUTPUT_LIMIT_BYTES].decode("utf-8", errors="replace")


@functools.cache
def _bwrap_problem() -> str | None:
    """None when bwrap runs a program here, else why not (tried once per process)."""
    if shutil.which("bwrap") is None:
        problem: str | None = "bwrap (bubblewrap) is not on PATH"
    else:
        exit_code, stderr = _probe_bwrap()
        reason = (stderr.strip().splitlines() or [f"exit code {exit_code}"])[-1]
        problem = None if exit_code == 0 else f"bwrap cannot run a program here: {reason}"
    if problem is not None:
        log.warning("sandbox: %s", problem)
    return problem


def choose_isolation(isolation: IsolationMode = "auto") -> Isolation:
    """The isolation a run with ``isolation`` gets: ``bwrap`` when asked for or when
    ``auto`` finds it working (tried once per process, blocking), else ``rlimits``.

    Raises :class:`SandboxUnavailable` when ``bwrap`` is asked for and cannot run.
    """
    if isolation == "rlimits":
        return "rlimits"
    problem = _bwrap_problem()
    if problem is None:
        return "bwrap"
    if isolation == "bwrap":
        raise SandboxUnavailable(
            f"{problem}; install bubblewrap, or set PONDER_SANDBOX_ISOLATION=auto or rlimits"
        )
    return "rlimits"


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


# ---------------------------------------------------------------------------------------
# The runner (asyncio: the loop is never blocked)
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


async def _run_async(launch: _Launch, stdin: bytes, timeout_s: float) -> SandboxResult:
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
        _kill_group(proc.pid)
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


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


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
    _check(timeout_s, memory_mb, isolation)
    chosen = await asyncio.to_thread(choose_isolation, isolation)
    with _launch("run", {"main.py": code}, chosen, timeout_s=timeout_s, memory_mb=memory_mb) as run:
        return await _run_async(run, stdin.encode("utf-8"), timeout_s)


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
    return TestReport(
        passed=passed,
        failed=failed,
        errors=errors,
        timed_out=result.timed_out,
        isolation=result.isolation,
    )


def _test_files(candidate: str, tests: str) -> dict[str, str]:
    return {"candidate.py": candidate, "tests.py": tests}


async def run_tests_async(
    candidate: str,
    tests: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 256,
    isolation: IsolationMode = "auto",
) -> TestReport:
    """Run ``candidate`` then ``tests`` (plain Python) in one namespace in the sandbox.

    Each top-level ``test*`` function (sync or async) is one test. Top-level ``assert``
    statements together are one more test (and the only one when there are no test
    functions). Both files run with ``__name__ == "__ponder_test__"``, so a candidate's
    ``if __name__ == "__main__":`` block does not run. If the candidate or the tests
    module raises, every planned test fails. Output printed by the code is discarded.
    The event loop is never blocked.
    """
    _check(timeout_s, memory_mb, isolation)
    chosen = await asyncio.to_thread(choose_isolation, isolation)
    nonce = secrets.token_hex(16)
    files = _test_files(candidate, tests)
    with _launch("tests", files, chosen, timeout_s=timeout_s, memory_mb=memory_mb) as run:
        result = await _run_async(run, (nonce + "\n").encode(), timeout_s)
    return _test_report(result, nonce, timeout_s)


def extract_program_output(text: str) -> str | None:
    """The program in a model answer: its last fenced ``python`` block (an untagged block
    if none is tagged), or None."""
    return extract_code_block(text, python_only=True)
