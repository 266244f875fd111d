"""Code-task tests in the sandbox: run a candidate and its tests, count what passed.

:func:`run_tests_async` runs the candidate, then the tests module, in one namespace (the
bootstrap's ``tests`` mode, :mod:`ponder.enhance.sandbox.launch`), each top-level
``test*`` function one test; the child reports each test on a stdout line prefixed by a
nonce of this run, which :func:`_test_report` reads into a :class:`TestReport` (tests
that did not report, on a timeout or a crash, count as failed).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from ponder.enhance.sandbox.launch import (
    Isolation,
    IsolationMode,
    check_run_args,
    choose_isolation,
    launching,
)
from ponder.enhance.sandbox.process import SandboxResult, run_launch

__all__ = ["TestReport", "run_tests_async"]

_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class TestReport:
    """Counts of a test run; on a timeout, tests that did not report count as failed."""

    __test__ = False  # not a pytest test class

    passed: int
    failed: int
    errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    isolation: Isolation = "rlimits"


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
    check_run_args(timeout_s, memory_mb, isolation)
    chosen = await asyncio.to_thread(choose_isolation, isolation)
    nonce = secrets.token_hex(16)
    files = _test_files(candidate, tests)
    with launching("tests", files, chosen, timeout_s=timeout_s, memory_mb=memory_mb) as run:
        result = await run_launch(run, (nonce + "\n").encode(), timeout_s)
    return _test_report(result, nonce, timeout_s)
