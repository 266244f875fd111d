"""The sandbox: real subprocesses, real limits (no mocks)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from ponder.enhance.sandbox import (
    OUTPUT_LIMIT_BYTES,
    SandboxResult,
    TestReport,
    extract_program_output,
    run_python,
    run_python_async,
    run_tests,
    run_tests_async,
)


def test_prints_are_captured() -> None:
    result = run_python("import sys\nprint('hello')\nprint('oops', file=sys.stderr)")
    assert result == SandboxResult(stdout="hello\n", stderr="oops\n", exit_code=0, timed_out=False)


def test_stdin_and_exit_code() -> None:
    result = run_python("import sys\nprint(input()[::-1])\nsys.exit(3)", stdin="abc\n")
    assert result.stdout == "cba\n"
    assert result.exit_code == 3


def test_an_exception_is_a_traceback_and_exit_code_1() -> None:
    result = run_python("1 / 0")
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr
    assert 'File "main.py", line 1' in result.stderr


def test_timeout_kills_an_infinite_loop() -> None:
    started = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.timed_out
    assert result.exit_code < 0
    assert time.monotonic() - started < 10


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "p.wait()\n"
    )
    result = run_python(code, timeout_s=2.0)
    assert result.timed_out
    child = int(pid_file.read_text())
    # killed with its group and reaped by init (or a zombie at worst): never running
    assert _not_running(child)


def _not_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_memory_limit_stops_a_big_allocation() -> None:
    result = run_python("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')", memory_mb=128)
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_network_is_blocked() -> None:
    code = (
        "import socket\n"
        "for attempt in (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),\n"
        "                lambda: socket.create_connection(('127.0.0.1', 80), timeout=1),\n"
        "                lambda: socket.getaddrinfo('example.com', 80)):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('reached')\n"
        "    except PermissionError as e:\n"
        "        print('blocked:', e)\n"
    )
    result = run_python(code)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("blocked: network access is disabled") == 3
    assert "reached" not in result.stdout


def test_local_socketpairs_still_work_for_asyncio() -> None:
    code = "import asyncio\nasync def main():\n    return 42\nprint(asyncio.run(main()))"
    assert run_python(code).stdout == "42\n"


def test_temp_dir_is_the_cwd_and_is_removed() -> None:
    code = (
        "import os\nopen('scratch.txt', 'w').write('x')\n"
        "print(os.getcwd())\nprint(os.environ['HOME'])"
    )
    result = run_python(code)
    cwd, home = result.stdout.split()
    assert cwd == home
    assert Path(cwd).name.startswith("ponder-sandbox-")
    assert not os.path.exists(cwd)


def test_environment_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("PONDER_SECRET", "s3cret")
    result = run_python("import os\nprint(sorted(os.environ))")
    assert "HTTPS_PROXY" not in result.stdout
    assert "PONDER_SECRET" not in result.stdout


def test_file_size_limit() -> None:
    result = run_python("open('big', 'wb').write(b'x' * (64 * 1024 * 1024))")
    assert result.exit_code != 0


def test_output_is_capped() -> None:
    result = run_python("print('x' * (10 * 1024 * 1024))")
    assert result.exit_code == 0
    assert result.truncated
    assert len(result.stdout) == OUTPUT_LIMIT_BYTES


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("pass", memory_mb=1)


# --- run_tests

CANDIDATE = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(input())\n"


def test_run_tests_counts_test_functions() -> None:
    tests = (
        "def test_small():\n    assert add(1, 2) == 3\n"
        "def test_wrong():\n    assert add(1, 2) == 4, 'not four'\n"
        "async def test_async():\n    assert add(0, 0) == 0\n"
        "def helper():\n    raise RuntimeError\n"
    )
    report = run_tests(CANDIDATE, tests)
    assert (report.passed, report.failed, report.timed_out) == (2, 1, False)
    assert report.errors == ["test_wrong: AssertionError: not four"]


def test_run_tests_top_level_asserts_are_one_test() -> None:
    assert run_tests(CANDIDATE, "assert add(1, 2) == 3\nassert add(2, 2) == 4\n") == TestReport(
        passed=1, failed=0
    )
    failing = run_tests(CANDIDATE, "assert add(1, 2) == 3\nassert add(2, 2) == 5\n")
    assert (failing.passed, failing.failed) == (0, 1)
    assert failing.errors == ["tests.py: AssertionError"]


def test_run_tests_a_broken_candidate_fails_every_test() -> None:
    report = run_tests("def add(a, b) return", "def test_a():\n    pass\ndef test_b():\n    pass\n")
    assert (report.passed, report.failed) == (0, 2)
    assert "SyntaxError" in report.errors[0]


def test_run_tests_timeout_counts_unreported_tests_as_failed() -> None:
    tests = (
        "def test_a():\n    pass\n"
        "def test_b():\n    while True:\n        pass\n"
        "def test_c():\n    pass\n"
    )
    report = run_tests(CANDIDATE, tests, timeout_s=1.0)
    assert report.timed_out
    assert (report.passed, report.failed) == (1, 2)


def test_run_tests_a_hard_exit_is_a_failure() -> None:
    report = run_tests("import os", "def test_a():\n    pass\ndef test_b():\n    os._exit(0)\n")
    assert (report.passed, report.failed) == (1, 1)
    assert "without a report" in report.errors[0]


def test_run_tests_prints_cannot_forge_the_report() -> None:
    tests = "def test_a():\n    print('{\"ok\": true}')\n    assert False\n"
    assert run_tests(CANDIDATE, tests) == TestReport(
        passed=0, failed=1, errors=["test_a: AssertionError"]
    )


# --- async variants


async def test_run_python_async() -> None:
    result = await run_python_async("print(sum(range(10)))")
    assert result == SandboxResult(stdout="45\n", stderr="", exit_code=0, timed_out=False)


async def test_run_python_async_runs_concurrently_and_times_out() -> None:
    started = time.monotonic()
    results = await asyncio.gather(
        run_python_async("while True:\n    pass", timeout_s=1.0),
        run_python_async("print('quick')"),
    )
    assert results[0].timed_out and not results[1].timed_out
    assert results[1].stdout == "quick\n"
    assert time.monotonic() - started < 10


async def test_run_python_async_cancellation_kills_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_python_async(code, timeout_s=30), 1.5)
    assert _not_running(int(pid_file.read_text()))


async def test_run_tests_async() -> None:
    report = await run_tests_async(CANDIDATE, "def test_a():\n    assert add(2, 3) == 5\n")
    assert report == TestReport(passed=1, failed=0)


def test_extract_program_output() -> None:
    text = "Let me compute.\n```python\nprint(6 * 7)\n```\nand\n```bash\necho\n```"
    code = extract_program_output(text)
    assert code == "print(6 * 7)"
    assert run_python(code).stdout == "42\n"
    assert extract_program_output("```\nprint(1)\n```") == "print(1)"
    assert extract_program_output("no code") is None
