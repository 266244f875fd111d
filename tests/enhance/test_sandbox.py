"""The sandbox: real subprocesses, real limits, real namespaces (no mocks).

Tests that hold on both isolations run on each (``isolation``); those that only bwrap
guarantees run on bwrap alone (``bwrap``). Both are skipped, and say why, where bwrap
cannot run; CI installs bubblewrap (``.ci/run``).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.enhance.sandbox import (
    NPROC_LIMIT,
    OUTPUT_LIMIT_BYTES,
    WORKDIR_BYTES,
    Isolation,
    SandboxResult,
    SandboxUnavailable,
    TestReport,
    choose_isolation,
    extract_program_output,
    launch,
    run_python_async,
    run_tests_async,
)
from ponder.enhance.strategy import create_strategy
from ponder.types import Sample, Task, TaskType

pytestmark = pytest.mark.timeout(60)


def _bwrap_or_skip() -> None:
    if choose_isolation("auto") != "bwrap":
        pytest.skip("bwrap cannot run here (the ponder.sandbox warning says why)")


@pytest.fixture(params=["bwrap", "rlimits"])
def isolation(request: pytest.FixtureRequest) -> Isolation:
    """Each isolation in turn."""
    if request.param == "bwrap":
        _bwrap_or_skip()
    chosen: Isolation = request.param
    return chosen


@pytest.fixture
def bwrap() -> Isolation:
    _bwrap_or_skip()
    return "bwrap"


def _alive_with(marker: str) -> list[int]:
    """Host processes (not zombies) whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def _try_each(paths: list[str], action: str) -> str:
    """Code that prints each path with what ``action`` (an expression of ``path``) gives,
    or with the name of the OSError it raises."""
    return (
        "import os\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        f"        print(path, {action})\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
    )


def _spawn_marked(marker: str, body: str = "while True: pass") -> str:
    """Code that starts a child interpreter (its argv holds ``marker``) running ``body``."""
    return (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {body!r}, {marker!r}])\n"
        "print('started', flush=True)\n"
        "p.wait()\n"
    )


async def test_prints_are_captured(isolation: Isolation) -> None:
    result = await run_python_async(
        "import sys\nprint('hello')\nprint('oops', file=sys.stderr)", isolation=isolation
    )
    assert result == SandboxResult("hello\n", "oops\n", 0, False, isolation=isolation)


async def test_stdin_and_exit_code(isolation: Isolation) -> None:
    result = await run_python_async(
        "import sys\nprint(input()[::-1])\nsys.exit(3)", stdin="abc\n", isolation=isolation
    )
    assert result.stdout == "cba\n"
    assert result.exit_code == 3


async def test_an_exception_is_a_traceback_and_exit_code_1(isolation: Isolation) -> None:
    result = await run_python_async("1 / 0", isolation=isolation)
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr
    assert 'File "main.py", line 1' in result.stderr


async def test_a_10_s_busy_loop_is_killed_at_the_limit(isolation: Isolation) -> None:
    code = (
        "import time\nend = time.monotonic() + 10\n"
        "while time.monotonic() < end:\n    pass\nprint('finished')"
    )
    started = time.monotonic()
    result = await run_python_async(code, timeout_s=1.0, isolation=isolation)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code < 0
    assert "finished" not in result.stdout
    assert elapsed < 8, elapsed  # killed at the limit, long before the loop would end


async def test_timeout_kills_every_process_of_the_run(isolation: Isolation) -> None:
    marker = f"ponder-test-{uuid.uuid4().hex}"
    result = await run_python_async(_spawn_marked(marker), timeout_s=2.0, isolation=isolation)
    assert result.timed_out and result.stdout == "started\n", result
    assert _alive_with(marker) == []


async def test_memory_limit_stops_a_big_allocation(isolation: Isolation) -> None:
    result = await run_python_async(
        "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')",
        memory_mb=128,
        isolation=isolation,
    )
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


async def test_a_memory_hog_is_contained(isolation: Isolation) -> None:
    code = "hog = []\nwhile True:\n    hog.append(bytearray(8 * 1024 * 1024))"
    result = await run_python_async(code, memory_mb=128, timeout_s=20, isolation=isolation)
    assert not result.timed_out and result.exit_code != 0
    assert "MemoryError" in result.stderr


async def test_network_is_blocked(isolation: Isolation) -> None:
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
    result = await run_python_async(code, isolation=isolation)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("blocked: network access is disabled") == 3
    assert "reached" not in result.stdout


#: connects to the test Redis on the host; prints the outcome
CONNECT_TO_REDIS = (
    "import socket\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', 6379), timeout=2)\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('failed:', type(e).__name__)\n"
)


async def test_redis_on_the_host_cannot_be_reached(isolation: Isolation, redis_url: str) -> None:
    """The test Redis answers on 127.0.0.1:6379 (the fixture pings it); the program cannot."""
    result = await run_python_async(CONNECT_TO_REDIS, isolation=isolation)
    assert result.stdout == "failed: PermissionError\n", result


async def test_bwrap_redis_cannot_be_reached_around_the_socket_guard(
    bwrap: Isolation, redis_url: str
) -> None:
    """Past the Python-level guard (a child interpreter has none, ctypes neither): the
    network namespace has no route to the host."""
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {CONNECT_TO_REDIS!r}])"
    result = await run_python_async(code, isolation="bwrap")
    assert result.stdout == "failed: ConnectionRefusedError\n", result
    real = "import socket\ns = socket.socket.__mro__[1](socket.AF_INET)\ns.settimeout(2)\n"
    result = await run_python_async(
        real + "print(s.connect_ex(('127.0.0.1', 6379)))", isolation="bwrap"
    )
    assert result.stdout.strip() == "111", result  # ECONNREFUSED: nothing listens there


def test_bwrap_host_files_cannot_be_read(bwrap: Isolation, tmp_path: Path) -> None:
    key = tmp_path / ".ssh" / "id_ed25519"
    key.parent.mkdir()
    key.write_text("PRIVATE KEY")
    assert Path("/etc/passwd").read_text()  # the host has them
    paths = ["/etc/passwd", "/etc/shadow", str(Path.home() / ".ssh"), str(key), "/home", "/tmp"]
    code = _try_each(paths, "os.listdir(path) if os.path.isdir(path) else open(path).read()")
    result = asyncio.run(run_python_async(code, isolation="bwrap"))
    assert result.exit_code == 0, result.stderr
    # a directory the sandbox made itself to bind the interpreter below it (a checkout
    # under /tmp or /home) lists those mount points only, none of the host's files
    bound = set(launch._python_layout()[1])
    made = {str(p) for path in bound for p in Path(path).parents}
    for line in result.stdout.splitlines():
        path, outcome = line.split(" ", 1)
        if path in made and outcome.startswith("["):
            listed = ast.literal_eval(outcome)
            assert all(f"{path}/{name}" in made | bound for name in listed), line
        else:
            assert outcome in ("FileNotFoundError", "PermissionError"), line
    assert len(result.stdout.splitlines()) == len(paths)


def test_bwrap_writes_outside_the_work_dir_fail(bwrap: Isolation, tmp_path: Path) -> None:
    targets = [
        "/x", "/tmp/x", "/etc/x", str(tmp_path / "x"), "/dev/shm/x",
        os.path.join(sysconfig.get_path("stdlib"), "x.py"),
        os.path.join(sysconfig.get_path("purelib"), "x.pth"),
    ]  # fmt: skip
    code = _try_each(targets, "open(path, 'w').write('written')") + (
        "open('inside.txt', 'w').write('ok')\nprint(os.getcwd(), open('inside.txt').read())\n"
    )
    result = asyncio.run(run_python_async(code, isolation="bwrap"))
    assert result.exit_code == 0, result.stderr
    *outside, inside = result.stdout.splitlines()
    assert len(outside) == len(targets)
    for line in outside:
        assert line.split()[-1] in ("FileNotFoundError", "PermissionError", "OSError"), line
    assert inside == "/sandbox ok"
    assert not any(os.path.exists(t) for t in targets[3:])


async def test_bwrap_the_work_dir_is_a_bounded_tmpfs(bwrap: Isolation) -> None:
    code = (
        "import os\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(100):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            for _ in range(4):\n"
        "                written += f.write(b'x' * (1024 * 1024 - 4096))\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e.errno)\n"
        "print(written)\n"
    )
    result = await run_python_async(code, isolation="bwrap")
    error, written = result.stdout.splitlines()
    assert error == "OSError 28"  # ENOSPC
    assert int(written) <= WORKDIR_BYTES


async def test_bwrap_runs_unprivileged(bwrap: Isolation) -> None:
    code = (
        "import os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), int(status['CapEff'], 16),\n"
        "      int(status['CapPrm'], 16), status['NoNewPrivs'].strip(), os.getpid() < 10)\n"
    )
    result = await run_python_async(code, isolation="bwrap")
    assert result.stdout == "65534 65534 [] 0 0 1 True\n", result


async def test_bwrap_a_fork_bomb_is_contained(bwrap: Isolation) -> None:
    # the children wait for the parent's end (the pipe's EOF), so that the limit shared
    # by every bwrap run as root is not held longer than the count takes
    count = (
        "import os\n"
        "r, w = os.pipe()\n"
        "children = 0\n"
        "try:\n"
        f"    for _ in range({NPROC_LIMIT * 4}):  # bounded: were the limit missing\n"
        "        if os.fork() == 0:\n"
        "            os.close(w)\n"
        "            os.read(r, 1)\n"
        "            os._exit(0)\n"
        "        children += 1\n"
        "except OSError as e:\n"
        "    print(children, type(e).__name__)\n"
        "else:\n"
        "    print(children, 'no-limit')\n"
    )
    result = await run_python_async(count, timeout_s=5, isolation="bwrap")
    children, error = result.stdout.split()
    assert error == "BlockingIOError" and int(children) < NPROC_LIMIT, result
    # contained, so a real one is safe to run: it ends at the timeout, leaving nothing
    marker = f"ponder-test-{uuid.uuid4().hex}"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = await run_python_async(_spawn_marked(marker, bomb), timeout_s=2, isolation="bwrap")
    assert result.timed_out
    assert _alive_with(marker) == []


async def test_local_socketpairs_still_work_for_asyncio(isolation: Isolation) -> None:
    code = "import asyncio\nasync def main():\n    return 42\nprint(asyncio.run(main()))"
    assert (await run_python_async(code, isolation=isolation)).stdout == "42\n"


def test_rlimits_temp_dir_is_the_cwd_and_is_removed() -> None:
    code = (
        "import os\nopen('scratch.txt', 'w').write('x')\n"
        "print(os.getcwd())\nprint(os.environ['HOME'])"
    )
    result = asyncio.run(run_python_async(code, isolation="rlimits"))
    cwd, home = result.stdout.split()
    assert cwd == home
    assert Path(cwd).name.startswith("ponder-sandbox-")
    assert not os.path.exists(cwd)


async def test_bwrap_work_dir_is_the_cwd_and_home(bwrap: Isolation) -> None:
    code = "import os\nprint(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'], os.listdir())"
    result = await run_python_async(code, isolation="bwrap")
    assert result.stdout == "/sandbox /sandbox /sandbox ['main.py']\n", result


async def test_environment_is_clean(isolation: Isolation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("PONDER_SECRET", "s3cret")
    result = await run_python_async("import os\nprint(sorted(os.environ))", isolation=isolation)
    assert "HTTPS_PROXY" not in result.stdout
    assert "PONDER_SECRET" not in result.stdout


async def test_file_size_limit(isolation: Isolation) -> None:
    result = await run_python_async(
        "open('big', 'wb').write(b'x' * (64 * 1024 * 1024))", isolation=isolation
    )
    assert result.exit_code != 0


async def test_output_is_capped(isolation: Isolation) -> None:
    result = await run_python_async("print('x' * (10 * 1024 * 1024))", isolation=isolation)
    assert result.exit_code == 0
    assert result.truncated
    assert len(result.stdout) == OUTPUT_LIMIT_BYTES


async def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        await run_python_async("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        await run_python_async("pass", memory_mb=1)
    with pytest.raises(ValueError, match="isolation"):
        await run_python_async("pass", isolation="docker")


async def test_the_installed_packages_can_be_imported(isolation: Isolation) -> None:
    """Programs may use what the environment has (its site-packages, read-only)."""
    result = await run_python_async(
        "import sympy\nprint(sympy.Integer(6) * 7)", isolation=isolation
    )
    assert result.stdout == "42\n", result.stderr


# --- choosing the isolation


@pytest.fixture
def no_bwrap_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PATH", "/nonexistent")
    launch._bwrap_problem.cache_clear()
    yield
    launch._bwrap_problem.cache_clear()


async def test_without_bwrap_auto_is_rlimits_and_bwrap_is_an_error(
    no_bwrap_on_path: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ponder.sandbox"):
        assert choose_isolation("auto") == "rlimits"
    assert "bwrap (bubblewrap) is not on PATH" in caplog.text
    assert (await run_python_async("print(1)")).isolation == "rlimits"
    with pytest.raises(SandboxUnavailable, match="PONDER_SANDBOX_ISOLATION"):
        await run_python_async("print(1)", isolation="bwrap")
    assert choose_isolation("rlimits") == "rlimits"


async def test_auto_is_bwrap_where_it_works(bwrap: Isolation) -> None:
    assert choose_isolation() == "bwrap"
    assert (await run_python_async("print(1)")).isolation == "bwrap"
    assert (await run_tests_async("x = 1", "assert x == 1")).isolation == "bwrap"


# --- run_tests

CANDIDATE = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(input())\n"


async def test_run_tests_counts_test_functions(isolation: Isolation) -> None:
    tests = (
        "def test_small():\n    assert add(1, 2) == 3\n"
        "def test_wrong():\n    assert add(1, 2) == 4, 'not four'\n"
        "async def test_async():\n    assert add(0, 0) == 0\n"
        "def helper():\n    raise RuntimeError\n"
    )
    report = await run_tests_async(CANDIDATE, tests, isolation=isolation)
    assert (report.passed, report.failed, report.timed_out) == (2, 1, False)
    assert report.errors == ["test_wrong: AssertionError: not four"]
    assert report.isolation == isolation


async def test_run_tests_top_level_asserts_are_one_test() -> None:
    report = await run_tests_async(CANDIDATE, "assert add(1, 2) == 3\nassert add(2, 2) == 4\n")
    assert (report.passed, report.failed, report.errors) == (1, 0, [])
    failing = await run_tests_async(CANDIDATE, "assert add(1, 2) == 3\nassert add(2, 2) == 5\n")
    assert (failing.passed, failing.failed) == (0, 1)
    assert failing.errors == ["tests.py: AssertionError"]


async def test_run_tests_a_broken_candidate_fails_every_test() -> None:
    report = await run_tests_async(
        "def add(a, b) return", "def test_a():\n    pass\ndef test_b():\n    pass\n"
    )
    assert (report.passed, report.failed) == (0, 2)
    assert "SyntaxError" in report.errors[0]


async def test_run_tests_timeout_counts_unreported_tests_as_failed(isolation: Isolation) -> None:
    tests = (
        "def test_a():\n    pass\n"
        "def test_b():\n    while True:\n        pass\n"
        "def test_c():\n    pass\n"
    )
    report = await run_tests_async(CANDIDATE, tests, timeout_s=1.0, isolation=isolation)
    assert report.timed_out
    assert (report.passed, report.failed) == (1, 2)


async def test_run_tests_a_hard_exit_is_a_failure() -> None:
    report = await run_tests_async(
        "import os", "def test_a():\n    pass\ndef test_b():\n    os._exit(0)\n"
    )
    assert (report.passed, report.failed) == (1, 1)
    assert "without a report" in report.errors[0]


async def test_run_tests_prints_cannot_forge_the_report() -> None:
    tests = "def test_a():\n    print('{\"ok\": true}')\n    assert False\n"
    report = await run_tests_async(CANDIDATE, tests)
    assert (report.passed, report.failed, report.errors) == (0, 1, ["test_a: AssertionError"])


# --- concurrency and cancellation


async def test_run_python_async(isolation: Isolation) -> None:
    result = await run_python_async("print(sum(range(10)))", isolation=isolation)
    assert result == SandboxResult("45\n", "", 0, False, isolation=isolation)


async def test_run_python_async_runs_concurrently_and_times_out(isolation: Isolation) -> None:
    started = time.monotonic()
    results = await asyncio.gather(
        run_python_async("while True:\n    pass", timeout_s=1.0, isolation=isolation),
        run_python_async("print('quick')", isolation=isolation),
    )
    assert results[0].timed_out and not results[1].timed_out
    assert results[1].stdout == "quick\n"
    assert time.monotonic() - started < 10


async def test_run_python_async_cancellation_kills_every_process(isolation: Isolation) -> None:
    marker = f"ponder-test-{uuid.uuid4().hex}"
    run = asyncio.create_task(
        run_python_async(_spawn_marked(marker), timeout_s=30, isolation=isolation)
    )
    async with asyncio.timeout(20):
        # another process tree has no event to wait on: poll /proc, bounded
        while not _alive_with(marker):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert _alive_with(marker) == []


async def test_run_tests_async(isolation: Isolation) -> None:
    report = await run_tests_async(
        CANDIDATE, "def test_a():\n    assert add(2, 3) == 5\n", isolation=isolation
    )
    assert report == TestReport(passed=1, failed=0, isolation=isolation)


async def test_extract_program_output() -> None:
    text = "Let me compute.\n```python\nprint(6 * 7)\n```\nand\n```bash\necho\n```"
    code = extract_program_output(text)
    assert code == "print(6 * 7)"
    assert (await run_python_async(code)).stdout == "42\n"
    assert extract_program_output("```\nprint(1)\n```") == "print(1)"
    assert extract_program_output("no code") is None


# --- the sample records which isolation ran


@pytest.mark.parametrize("setting", ["auto", "rlimits", "bwrap"])
async def test_a_judged_sample_records_its_isolation(setting: str) -> None:
    if setting == "bwrap":
        _bwrap_or_skip()
    settings = load_settings(sandbox_isolation=setting)
    expected = choose_isolation(settings.sandbox_isolation)
    task = Task(id="1764412800123-t-1", task_type=TaskType.math, prompt="6 * 7?")
    pot = Sample(index=0, path="pot", temperature=0, seed=0, text="```python\nprint(6 * 7)\n```")
    await create_strategy(task, settings).judge(pot)
    assert (pot.program_output, pot.answer, pot.isolation) == ("42\n", "42", expected)
    code_task = Task(
        id="1764412800123-t-2", task_type=TaskType.code, prompt="add", tests="assert add(1, 2) == 3"
    )
    candidate = Sample(
        index=0,
        path="cot",
        temperature=0,
        seed=0,
        text="```python\ndef add(a, b):\n    return a + b\n```",
    )
    await create_strategy(code_task, settings).judge(candidate)
    assert (candidate.tests_passed, candidate.tests_failed) == (1, 0)
    assert candidate.isolation == expected
    plain = Sample(index=0, path="cot", temperature=0, seed=0, text="The answer is 42.")
    await create_strategy(task, settings).judge(plain)
    assert plain.isolation is None  # nothing ran
