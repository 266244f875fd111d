"""The CLI as a user runs it: real subprocesses against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from ponder.config import Settings
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(90)


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ponder.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_wait_prints_the_result(sqlite_settings: Settings) -> None:
    async with LiveServer(sqlite_settings, workers=1) as live:
        code, out, _ = await run_cli(
            "submit", "What is 6*7? [[answers: 42, 42, 41]]", "--wait", "--url", live.url
        )
        assert code == 0, out
        assert "done" in out and "42" in out
        code, out, _ = await run_cli(
            "submit", "[[answers: 5]]", "--mode", "fast", "--wait", "--json", "--url", live.url
        )
        assert code == 0
        assert json.loads(out)["result"]["answer"] == "5"
        code, out, _ = await run_cli("submit", "[[fail]]", "--wait", "--url", live.url)
        assert code == 1
        assert "failed" in out
        code, out, _ = await run_cli("submit", "no wait [[answers: 1]]", "--url", live.url)
        assert code == 0 and out.strip().split("-")[1] == "test1"


async def test_usage_errors_exit_2() -> None:
    code, _, err = await run_cli("submit", "x", "--priority", "9")
    assert code == 2
    assert "priority" in err
    code, _, err = await run_cli("worker", env={"PONDER_REDIS_URL": ""})
    assert code == 2
    code, _, err = await run_cli("serve", env={"PONDER_MAX_PENDING": "-3"})
    assert code == 2 and "PONDER_MAX_PENDING" in err


async def test_help_everywhere() -> None:
    for command in ([], ["serve"], ["api"], ["worker"], ["submit"], ["keys", "new"]):
        code, out, _ = await run_cli(*command, "--help")
        assert code == 0 and "Usage" in out


async def test_keys_new_prints_key_and_digest() -> None:
    import hashlib

    code, out, _ = await run_cli("keys", "new")
    assert code == 0
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    key, digest = lines["key"].strip(), lines["digest"].strip()
    assert hashlib.sha256(key.encode()).hexdigest() == digest
