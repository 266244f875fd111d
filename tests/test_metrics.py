"""Prometheus metrics of a split deployment: a real `ponder worker` process serves its own."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ponder.config import Settings
from tests.conftest import LiveServer, wait_for_task
from tests.test_cli import run_cli
from tests.test_reliability import Proc, free_port, ponder_env, processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_worker_serves_its_own_metrics(redis_settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    env = ponder_env(redis_settings, "wM", metrics_port=port)
    async with (
        processes() as procs,
        LiveServer(redis_settings, workers=0) as live,
        httpx.AsyncClient(base_url=live.url, timeout=30) as c,
    ):
        worker = Proc(tmp_path / "worker.log", env, "worker")
        procs.append(await worker.start())
        await worker.wait_log(f"metrics on http://127.0.0.1:{port}/metrics")
        await worker.wait_log("worker wM running")
        for prompt in ("[[answers: 4, 4, 5]]", "[[fail]]"):
            task = (await c.post("/v1/tasks", json={"prompt": prompt})).json()
            await wait_for_task(c, task["id"])
        scraped = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
        api_side = samples((await c.get("/metrics")).text)
    got = samples(scraped)
    # the engine's batch (continuous batching: rows admitted, rows by state, throughput)
    assert got[("ponder_engine_queue_wait_seconds_count", ())] >= 4
    assert ("ponder_engine_rows", (("model", "ponder"), ("state", "running"))) in got
    assert got[("ponder_sample_latency_seconds_count", ())] >= 4
    assert got[("ponder_completion_tokens_total", ())] > 0
    assert ("ponder_engine_tokens_per_second", (("model", "ponder"),)) in got
    assert got[("ponder_model_loaded", (("model", "ponder"),))] == 1  # loaded at start
    assert got[("ponder_tasks_finished_total", (("status", "done"),))] == 1
    assert got[("ponder_tasks_finished_total", (("status", "failed"),))] == 1
    assert api_side[("ponder_tasks_submitted_total", (("mode", "standard"),))] >= 2
    assert api_side[("ponder_queue_depth", (("model", "ponder"), ("priority", "3")))] == 0


async def test_a_busy_metrics_port_is_a_one_line_error(redis_settings: Settings) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = ponder_env(redis_settings, "wM")
        code, _, err = await run_cli("worker", "--metrics-port", str(port), env=env)
    assert code == 2
    assert "PONDER_METRICS_PORT" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
