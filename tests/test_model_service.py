"""The whole service on the real local model (the default engine, OpenVINO GenAI's pipeline in
an engine process of its own): HTTP in, model text out."""

from __future__ import annotations

import httpx
import pytest

from ponder.config import Settings
from tests.conftest import LiveServer, wait_for_task

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_task_ends_done_with_model_text(sqlite_settings: Settings) -> None:
    settings = sqlite_settings.model_copy(update={"engine": "openvino", "engine_threads": 1})
    async with (
        LiveServer(settings, workers=1) as live,
        httpx.AsyncClient(base_url=live.url, timeout=30) as client,
    ):
        created = await client.post(
            "/v1/tasks",
            json={"prompt": "What is the capital of France?", "mode": "standard",
                  "samples": 3, "max_new_tokens": 24, "task_type": "text"},
        )  # fmt: skip
        assert created.status_code == 202
        task = await wait_for_task(client, created.json()["id"], timeout_s=240)
    assert task["status"] == "done", task.get("error")
    done = [s for s in task["samples"] if s["status"] == "done"]
    assert len(done) >= 2  # early stopping may skip the third
    for sample in done:
        assert sample["text"].strip()
        assert 0 < sample["tokens"]["completion"] <= 24
        assert sample["tokens"]["prompt"] > 5  # the chat template wraps the prompt
        assert sample["mean_logprob"] < 0
    result = task["result"]
    assert result["text"].strip() and sum(result["votes"].values()) == len(done)
    # every token generated counts, a sample the early stop cut short too
    assert task["usage"]["completion_tokens"] == sum(
        s["tokens"]["completion"] for s in task["samples"]
    )
