"""``GET /v1/overview``: the console's live figures, all-in-one and API-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ponder.api.deps import key_digest
from ponder.config import Settings, load_settings
from tests.conftest import LiveServer, until, wait_for_task

pytestmark = pytest.mark.timeout(60)


async def test_all_in_one_has_the_engine_and_the_finished_tasks(
    client: httpx.AsyncClient,
) -> None:
    first = (await client.get("/v1/overview")).json()
    assert first["role"] == "all-in-one" and first["note"] is None
    assert first["workers"] == 1 and first["tasks_running"] == 0
    assert first["engine"]["name"] == "scripted" and first["engine"]["rows_running"] == 0
    assert set(first["queue"]["by_priority"]) == {str(p) for p in range(6)}
    done_before = first["finished"]["total"]["done"]
    for answers in ("1", "2"):
        task = (await client.post("/v1/tasks", json={"prompt": f"[[answers: {answers}]]",
                                                      "mode": "fast"})).json()  # fmt: skip
        await wait_for_task(client, task["id"])
    later = (await client.get("/v1/overview")).json()
    assert later["finished"]["total"]["done"] == done_before + 2
    recent = later["finished"]["recent"]
    assert len(recent) == 10 and recent[-1]["done"] >= 2  # counted in the current minute
    assert sum(b["done"] for b in recent) == 2  # since the first look, and no more
    assert first["time"][:16] <= later["finished"]["since"] <= later["time"]
    assert later["tokens_per_s"] is not None and later["tokens_per_s"] > 0
    assert later["engine"]["tokens"] > first["engine"]["tokens"]


async def test_api_only_has_the_store_figures_and_says_why_not_more(settings: Settings) -> None:
    async with LiveServer(settings, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        for priority in (0, 3, 3):
            await c.post("/v1/tasks", json={"prompt": "x", "priority": priority})
        body = (await c.get("/v1/overview")).json()
    assert body["role"] == "api" and "API only" in body["note"]
    levels = {"0": 1, "1": 0, "2": 0, "3": 2, "4": 0, "5": 0}
    assert body["queue"] == {"pending": 3, "by_priority": levels, "by_model": {"ponder": 3}}
    assert body["workers"] == 0
    # the one model without a models file: its queue, and no live worker serves it
    assert body["models"] == [
        {"model": "ponder", "state": None, "resident_mb": None, "workers": 0,
         "queue": {"pending": 3, "by_priority": levels}, "by_worker": []}
    ]  # fmt: skip
    assert body["engine"] is body["tasks_running"] is body["finished"] is None


async def test_it_needs_a_key_when_keys_are_on(settings: Settings) -> None:
    secured = settings.model_copy(update={"api_keys": [key_digest("pk_a")]})
    async with LiveServer(secured, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        response = await c.get("/v1/overview")
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
        ok = await c.get("/v1/overview", headers={"Authorization": "Bearer pk_a"})
        assert ok.status_code == 200


TWO_MODELS = """
[models.small]
engine = "scripted"
keep_alive_s = 300

[models.big]
engine = "scripted"
keep_alive_s = 300
"""


async def test_each_model_has_its_state_workers_and_queue(
    sqlite_settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(TWO_MODELS)
    settings = load_settings(
        **{**sqlite_settings.model_dump(), "models_file": str(path), "lease_s": 3.0}
    )
    async with LiveServer(settings, workers=1) as live, httpx.AsyncClient(base_url=live.url) as c:
        first = (await c.get("/v1/overview")).json()
        assert [(m["model"], m["state"], m["workers"]) for m in first["models"]] == [
            ("small", "unloaded", 1),
            ("big", "unloaded", 1),
        ]
        task = (await c.post("/v1/tasks", json={"prompt": "[[answers: 3]]", "model": "big",
                                                "mode": "fast"})).json()  # fmt: skip
        assert (await wait_for_task(c, task["id"]))["status"] == "done"
        # the worker registers again as its model's state changes (not a heartbeat later)
        body = await until(lambda: _overview_with(c, "big", "loaded"), 10, "big loaded")
        big = next(m for m in body["models"] if m["model"] == "big")
        assert big["workers"] == 1 and big["resident_mb"] is None  # scripted: in-process
        assert big["by_worker"] == [
            {"model": "big", "worker": "test1-big-w0", "state": "loaded", "resident_mb": None}
        ]
        assert big["queue"]["pending"] == 0 and body["queue"]["pending"] == 0
        engine = body["engine"]
        assert [(m["model"], m["state"]) for m in engine["models"]] == [
            ("small", "unloaded"),
            ("big", "loaded"),
        ]
        assert engine["models"][1]["loads"] == 1 and engine["models"][1]["live"] is not None
        ready = (await c.get("/readyz")).json()
        assert ready["status"] == "ready" and ready["engine"] == "live"  # small: unloaded


async def _overview_with(c: httpx.AsyncClient, model: str, state: str) -> dict[str, Any] | None:
    body: dict[str, Any] = (await c.get("/v1/overview")).json()
    found = [m["state"] for m in body["models"] if m["model"] == model]
    return body if found == [state] else None
