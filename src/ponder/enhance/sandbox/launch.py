"""How one sandbox run starts, and in which isolation.

The isolation (``bwrap`` namespaces when bubblewrap works here, else best-effort
``rlimits``: :func:`choose_isolation`), the bootstrap the child interpreter runs before
any of the user's code (identity, limits, network guard; then ``main.py``, or the test
protocol :mod:`ponder.enhance.sandbox.harness` reads), and :func:`launching`: the
command, working directory, clean environment and files of one run (bwrap's argv over
anonymous memory files, or a host temporary directory). Nothing here waits on a run;
:mod:`ponder.enhance.sandbox.process` runs what is launched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ponder.errors import PonderError

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
#: the longest the check that bwrap works may take
_PROBE_TIMEOUT_S = 10.0


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


def check_run_args(timeout_s: float, memory_mb: int, isolation: str) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if memory_mb < 32:
        raise ValueError(
            f"memory_mb must be at least 32 (the interpreter needs it), got {memory_mb}"
        )
    if isolation not in ("auto", "bwrap", "rlimits"):
        raise ValueError(f"isolation must be auto, bwrap or rlimits, got {isolation!r}")


@dataclass(frozen=True)
class Launch:
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
def launching(
    mode: str, files: dict[str, str], isolation: Isolation, *, timeout_s: float, memory_mb: int
) -> Iterator[Launch]:
    limits = _limits(timeout_s, memory_mb)
    if isolation == "bwrap":
        with _memfds(files) as fds:
            argv = _bwrap_argv(mode, limits, fds)
            yield Launch(argv, "/", _clean_env(_SANDBOX_DIR), "bwrap", tuple(fds.values()))
        return
    with _host_workdir(files) as tmpdir:
        argv = [sys.executable, *_PYTHON_FLAGS, "-c", _BOOTSTRAP, mode, *limits, "-1", "-1"]
        yield Launch(argv, tmpdir, _clean_env(tmpdir), "rlimits")


def _probe_bwrap() -> tuple[int, str]:
    """Run ``pass`` under bwrap, blocking (once per process): its exit code and stderr."""
    with launching("run", {"main.py": "pass"}, "bwrap", timeout_s=10, memory_mb=256) as probe:
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
            kill_group(proc.pid)
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


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
