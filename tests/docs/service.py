"""``ponder serve`` for the docs tests: the scripted engine on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import free_port, until

#: how long one documented block may run
BLOCK_TIMEOUT_S = 60


def run_block(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A documented block's command run as a reader would (nothing on stdin), its output
    captured; ``subprocess.TimeoutExpired`` after ``BLOCK_TIMEOUT_S``."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def scripted_service(workdir: Path, node_id: str, env: dict[str, str]) -> Iterator[str]:
    """``ponder serve`` (scripted engine writing a word every 10 ms, so that running
    samples send ``delta`` events as a model does; embedded store in ``workdir``; auth
    off; ``env`` on top) on a free loopback port, never 8000; its base URL."""
    port = free_port()
    assert port != 8000
    full = {
        **os.environ,
        "PONDER_ENGINE": "scripted",
        "PONDER_SCRIPTED_STEP_MS": "10,0",
        "PONDER_SQLITE_PATH": str(workdir / "ponder.db"),
        "PONDER_REDIS_URL": "",
        "PONDER_NODE_ID": node_id,
        "PONDER_LOG_LEVEL": "WARNING",
        **env,
    }
    full.pop("PONDER_API_KEYS", None)
    log_path = workdir / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ponder"), "serve", "--port", str(port)],
            env=full,
            stdout=log,
            stderr=log,
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:  # another process: no event announces it is up
                assert proc.poll() is None, log_path.read_text()
                try:
                    return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            asyncio.run(until(ready, 60, "ponder serve to be ready", interval_s=0.1))
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
