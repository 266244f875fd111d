"""Split roles over Redis: one `ponder api` of two API processes (`--processes 2`) and two
`ponder worker` processes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import psutil
import pytest

from tests.conftest import wait_for_task
from tests.split import ponder_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
async def cluster(redis_url: str, key_prefix: str) -> AsyncIterator[str]:
    base = {
        "PONDER_REDIS_URL": redis_url,
        "PONDER_KEY_PREFIX": key_prefix,
        "PONDER_ENGINE": "scripted",
        "PONDER_SCRIPTED_STEP_MS": "5,1",
        "PONDER_BATCH_MAX_WAIT_MS": "5",
        "PONDER_CLAIM_BLOCK_MS": "200",
    }
    async with ponder_processes(base, ("wA", "wB"), ("--processes", "2")) as (url, procs):
        api = psutil.Process(procs[0].pid)
        servers = [c for c in api.children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(servers) == 2, api.children()
        yield url
    # the API's supervisor stopped its processes before it exited
    assert not [s for s in servers if s.is_running() and s.status() != psutil.STATUS_ZOMBIE]


async def test_200_tasks_over_two_workers(cluster: str) -> None:
    async with httpx.AsyncClient(base_url=cluster, timeout=30) as c:
        created = await asyncio.gather(
            *(
                c.post("/v1/tasks", json={"prompt": f"t{i} [[answers: {i}]]", "priority": i % 6})
                for i in range(200)
            )
        )
        assert all(r.status_code == 202 for r in created)
        ids = [r.json()["id"] for r in created]
        # each API process names itself in its ids (the configured node id + its pid)
        assert len(set(ids)) == 200
        assert all(i.split("-")[1].startswith("api1.") for i in ids)
        tasks = [await wait_for_task(c, i, timeout_s=120) for i in ids]
    assert Counter(t["status"] for t in tasks) == {"done": 200}
    for i, task in enumerate(tasks):
        assert task["result"]["answer"] == str(i)
        assert task["attempts"] == 1  # started once: each sample computed exactly once
        assert [s["index"] for s in task["samples"]] == [0, 1, 2]
