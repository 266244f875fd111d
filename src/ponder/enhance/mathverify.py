"""math-verify comparisons in a bounded process pool whose worker is killed on timeout.

sympy can spend unbounded time inside C code (huge powers, factorials, some
simplifications), where no thread can be interrupted. Each comparison therefore runs in
a ``pebble.ProcessPool`` worker process: one that is still busy after
:data:`MATH_VERIFY_TIMEOUT_S` is killed and replaced by a fresh worker, and the
comparison counts as "not the same". The pool is started on first use (its worker
imports sympy and warms math-verify's grammar before taking work), holds at most
:data:`POOL_WORKERS` processes, admits at most :data:`MAX_PENDING` comparisons at a time
(callers beyond that wait), and is shut down at interpreter exit or by
:func:`shutdown_pool`.

Workers are started with ``spawn``: forking a process that runs torch threads and an
event loop is unsafe.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

__all__ = [
    "MATH_VERIFY_TIMEOUT_S",
    "MAX_PENDING",
    "POOL_WORKERS",
    "MathVerifyPool",
    "get_pool",
    "shutdown_pool",
    "verify_pair",
]

#: one comparison (parse both + verify both ways) is killed after this long
MATH_VERIFY_TIMEOUT_S = 5.0
POOL_WORKERS = 1
#: comparisons admitted at once; more callers wait for a slot
MAX_PENDING = 64
#: how long a caller waits beyond the timeout (a worker starting up: spawn + sympy)
_START_SLACK_S = 60.0
_HUGE = 1000

_T = TypeVar("_T")
log = logging.getLogger("ponder.enhance")


# --- the worker side ---------------------------------------------------------------------
class _DropTimeoutNotice(logging.Filter):
    """math-verify logs once that its timeout is off; the pool bounds it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> Any:
    import math_verify  # type: ignore[import-untyped]

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())
    math_verify.parse("$1$", parsing_timeout=None)  # builds the LaTeX grammar once
    return math_verify


def _warm() -> None:
    _math_verify()


@functools.lru_cache(maxsize=2048)
def _parse(s: str) -> tuple[Any, ...]:
    mv = _math_verify()
    parsed = mv.parse(
        f"${s}$",
        extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
        parsing_timeout=None,
    )
    return tuple(parsed)


def _safe_to_verify(parsed: tuple[Any, ...]) -> bool:
    """False when sympy would surely spend unbounded time (huge powers, factorials).

    The pool's timeout is the real bound; this check saves a killed worker (and its
    restart) for the inputs known to hang.
    """
    import sympy  # type: ignore[import-untyped]

    for expr in parsed:
        if not isinstance(expr, sympy.Basic):
            continue
        for count, node in enumerate(sympy.preorder_traversal(expr)):
            if count > 400:
                return False
            if isinstance(node, sympy.Pow):
                if node.exp.free_symbols:
                    continue
                try:
                    value = complex(node.exp.evalf(15))
                except (TypeError, ValueError, ArithmeticError):
                    return False
                if not abs(value) <= _HUGE:
                    return False
            elif isinstance(node, sympy.Function) or getattr(node, "is_Function", False):
                for arg in getattr(node, "args", ()):
                    if isinstance(arg, sympy.Basic) and not arg.free_symbols:
                        try:
                            value = complex(arg.evalf(15))
                        except (TypeError, ValueError, ArithmeticError):
                            return False
                        if not abs(value) <= 100 * _HUGE:
                            return False
    return True


def verify_pair(a: str, b: str) -> bool:
    """math-verify of two LaTeX answers, in both directions (runs in the worker)."""
    mv = _math_verify()
    pa, pb = _parse(a), _parse(b)
    if not pa or not pb or not _safe_to_verify(pa) or not _safe_to_verify(pb):
        return False
    return bool(
        mv.verify(list(pa), list(pb), timeout_seconds=None)
        or mv.verify(list(pb), list(pa), timeout_seconds=None)
    )


# --- the caller side ---------------------------------------------------------------------
class MathVerifyPool:
    """A bounded pool of math-verify worker processes (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int = POOL_WORKERS,
        timeout_s: float = MATH_VERIFY_TIMEOUT_S,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if workers < 1 or max_pending < 1 or timeout_s <= 0:
            raise ValueError("workers and max_pending must be >= 1 and timeout_s > 0")
        self.workers = workers
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._pool: Any = None
        self._closed = False
        #: comparisons whose worker was killed at the timeout (for tests and logs)
        self.killed = 0

    def _started(self) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the math-verify pool is shut down")
            if self._pool is None:
                from pebble import ProcessPool

                self._pool = ProcessPool(
                    max_workers=self.workers,
                    initializer=_warm,
                    context=multiprocessing.get_context("spawn"),
                )
            return self._pool

    def run(self, fn: Callable[..., _T], *args: Any, default: _T) -> _T:
        """``fn(*args)`` in a worker; ``default`` when it times out (the worker is killed
        and replaced) or fails."""
        with self._slots:
            try:
                future = self._started().schedule(fn, args=args, timeout=self.timeout_s)
            except RuntimeError:
                return default
            try:
                return future.result(timeout=self.timeout_s + _START_SLACK_S)  # type: ignore[no-any-return]
            except FutureTimeout:
                # pebble's own timeout kills the worker; a future that never started
                # (a worker stuck starting) is cancelled here
                future.cancel()
                self.killed += 1
                log.warning("math-verify comparison killed after %.1fs", self.timeout_s)
                return default
            except CancelledError:
                return default
            except Exception as e:  # an error inside math-verify: not the same
                log.debug("math-verify failed: %r", e)
                return default

    def same(self, a: str, b: str) -> bool:
        """Whether math-verify finds ``a`` and ``b`` equal (False on timeout)."""
        return self.run(verify_pair, a, b, default=False)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join(timeout=10)


_shared: MathVerifyPool | None = None
_shared_lock = threading.Lock()


def get_pool() -> MathVerifyPool:
    """The process-wide pool (started lazily, stopped at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = MathVerifyPool()
        return _shared


def shutdown_pool() -> None:
    """Stop the process-wide pool's workers; a later comparison starts a new pool."""
    global _shared
    with _shared_lock:
        pool, _shared = _shared, None
    if pool is not None:
        pool.close()


atexit.register(shutdown_pool)
