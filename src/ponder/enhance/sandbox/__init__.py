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

from ponder.enhance.fences import extract_program_output
from ponder.enhance.sandbox.harness import TestReport, run_tests_async
from ponder.enhance.sandbox.launch import (
    NPROC_LIMIT,
    OUTPUT_LIMIT_BYTES,
    WORKDIR_BYTES,
    Isolation,
    IsolationMode,
    SandboxUnavailable,
    choose_isolation,
)
from ponder.enhance.sandbox.process import SandboxResult, run_python_async

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
