"""Split roles over Redis for the tests that run them as processes of their own: a
``ponder api`` and ``ponder worker`` processes, started, waited for and stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence

import httpx

from tests.conftest import free_port, until


async def spawn(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    """``python -m ponder.cli *args`` with ``env`` added to this environment; its stderr
    is kept for the exit check."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ponder.cli", *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def ponder_processes(
    env: dict[str, str], workers: Sequence[str] = ("w1",), api_args: Sequence[str] = ()
) -> AsyncIterator[tuple[str, list[asyncio.subprocess.Process]]]:
    """``ponder api`` (node ``api1``, on a free port, with ``api_args``) and one ``ponder
    worker`` per node id in ``workers``, each with ``env``; yields the API's URL once its
    ``/readyz`` counts every worker, and the processes (the API's first). At the end each
    gets SIGTERM and must have ended with 0 (or by that signal)."""
    port = free_port()
    procs = [await spawn({**env, "PONDER_NODE_ID": "api1"}, "api", "--port", str(port), *api_args)]
    for node_id in workers:
        procs.append(await spawn({**env, "PONDER_NODE_ID": node_id}, "worker"))
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as c:

            async def ready() -> bool:  # no event to wait on across processes
                with contextlib.suppress(httpx.TransportError):
                    r = await c.get("/readyz")
                    return r.status_code == 200 and r.json()["workers"] == len(workers)
                return False

            await until(ready, 30, f"the api and {len(workers)} worker(s) ready", 0.1)
        yield url, procs
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            _, err = await asyncio.wait_for(p.communicate(), 30)
            assert p.returncode in (0, -15), err.decode()[-2000:]
