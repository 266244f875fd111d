"""The HTTP contract of API.md, through a real server on loopback, on both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ponder.config import Settings
from tests.conftest import LiveServer, wait_for_task

pytestmark = pytest.mark.timeout(60)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert "Traceback" not in response.text
    return body


async def test_submit_poll_result(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tasks",
        json={"prompt": "What is 17 * 24? [[answers: 408, 418, 408]]", "metadata": {"user": "42"}},
    )
    assert response.status_code == 202
    task = response.json()
    assert response.headers["location"] == f"/v1/tasks/{task['id']}"
    assert task["status"] == "pending"
    assert task["id"].split("-")[1] == "test1"
    assert task["samples_planned"] == 3
    assert task["metadata"] == {"user": "42"}
    done = await wait_for_task(client, task["id"])
    assert done["status"] == "done"
    assert done["result"]["answer"] == "408"
    assert done["result"]["votes"] == {"408": 2, "418": 1}
    assert done["samples_done"] == 3
    assert {s["status"] for s in done["samples"]} == {"done"}
    for key in ("created_at", "started_at", "finished_at", "usage", "preliminary", "error"):
        assert key in done


async def test_messages_input(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tasks",
        json={"messages": [{"role": "user", "content": "hi [[answers: 1]]"}], "mode": "fast"},
    )
    assert response.status_code == 202
    assert (await wait_for_task(client, response.json()["id"]))["status"] == "done"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a", "priority": 6}, "priority"),
        ({"prompt": "a", "priority": -1}, "priority"),
        ({"prompt": "a", "mode": "turbo"}, "mode"),
        ({"prompt": "a", "task_type": "poem"}, "task_type"),
        ({"prompt": "a", "samples": 99}, "samples"),
        ({"prompt": "a", "mode": "fast", "samples": 2}, "samples"),
        ({"prompt": "a", "max_new_tokens": 100000}, "max_new_tokens"),
        ({"prompt": "a", "temperature": 3}, "temperature"),
        ({"prompt": "a", "timeout_s": 10**6}, "timeout_s"),
        ({"prompt": "a", "callback_url": "ftp://example.com/x"}, "callback_url"),
        ({"prompt": "a", "callback_url": "not a url"}, "callback_url"),
        ({"prompt": "a", "metadata": {"k": "v" * 5000}}, "metadata"),
        ({"prompt": "a", "metadata": [1, 2]}, "metadata"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"prompt": 5}, "prompt"),
        # strict input: unknown fields are named, with the field meant when one is close
        ({"prompt": "a", "max_tokens": 5}, "field `max_tokens` (did you mean `max_new_tokens`?)"),
        ({"prompt": "a", "n": 2}, "unknown field `n` (did you mean `samples`?)"),
        ({"prompt": "a", "mdoe": "x", "zzz": 1}, "fields `mdoe` (did you mean `mode`?), `zzz`"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages.0: unknown field `tool_calls`",
        ),
        # no coercion: a bool is not an integer, a string is not a number
        ({"prompt": "a", "priority": True}, "priority: Input should be a valid integer"),
        ({"prompt": "a", "priority": "3"}, "priority: Input should be a valid integer"),
        ({"prompt": "a", "priority": 3.0}, "priority: Input should be a valid integer"),
        ({"prompt": "a", "samples": "2"}, "samples"),
        ({"prompt": "a", "temperature": "0.5"}, "temperature: Input should be a valid number"),
        ({"prompt": "a", "timeout_s": False}, "timeout_s"),
        ({"prompt": "a", "early_stop": "yes"}, "early_stop: Input should be a valid boolean"),
        ({"prompt": "a", "early_stop": 1}, "early_stop"),
        ({"prompt": "a", "stop": "x"}, "stop"),
        ({"prompt": "a", "samples": 10**40}, "samples: " + str(10**40) + " is over"),
        # the budget
        ({"prompt": "a", "max_samples": 0}, "max_samples: Input should be greater than"),
        ({"prompt": "a", "max_total_tokens": 0}, "max_total_tokens: Input should be greater"),
        ({"prompt": "a", "max_total_tokens": "9"}, "max_total_tokens"),
        ({"prompt": "a", "samples": 5, "max_samples": 3}, "samples (5) is over max_samples (3)"),
        ({"prompt": "a", "mode": "auto", "max_samples": 13}, "max_samples: 13 is over the auto"),
        ({"prompt": "a", "mode": "cascade"}, "mode: Input should be 'fast', 'standard', 'deep'"),
        # blank prompts, and callback URLs that no receiver can be at
        ({"prompt": " \n\t "}, "prompt: the prompt is blank"),
        ({"prompt": "a", "callback_url": "http://example.com:0/hook"}, "callback_url: port 0"),
        ({"prompt": "a", "callback_url": "https://user:pw@example.com/h"}, "user name or password"),
        ({"prompt": "a", "callback_url": "https://token@example.com/h"}, "user name or password"),
    ],
)
async def test_invalid_requests_change_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    error = assert_error(await client.post("/v1/tasks", json=body), 422, "invalid")
    assert field in error["error"]["message"]
    listing = (await client.get("/v1/tasks")).json()
    assert listing["data"] == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"prompt": "a", "metadata": {"score": NaN}}', "metadata: `score` is NaN or Infinity"),
        (b'{"prompt": "a", "metadata": {"a": [0, {"b": -Infinity}]}}', "metadata: `a[1].b`"),
        (b'{"prompt": "a", "temperature": Infinity}', "temperature: Input should be a finite"),
        (b'{"prompt": "a", "timeout_s": 1e999}', "timeout_s: Input should be a finite number"),
        (b'{"prompt": "a", "samples": 1' + b"0" * 5000 + b"}", "a number of 5001 digits"),
        (b'{"prompt": "a", "metadata": {"n": -' + b"9" * 101 + b"}}", "a number of 101 digits"),
    ],
)
async def test_non_finite_and_oversized_numbers_are_422(
    client: httpx.AsyncClient, body: bytes, fragment: str
) -> None:
    response = await client.post(
        "/v1/tasks", content=body, headers={"content-type": "application/json"}
    )
    assert fragment in assert_error(response, 422, "invalid")["error"]["message"]
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_a_valid_body_left_to_fastapis_handler_makes_the_same_task(
    client: httpx.AsyncClient,
) -> None:
    # a valid body is validated in one pass; a run of over 100 digits (here inside a
    # string, where it is allowed) leaves the body to FastAPI's handler: both make the same
    # task from the same request
    digits = "7" * 101
    body = {"prompt": f"Say {digits} [[answers: 1]]", "mode": "fast", "metadata": {"k": [1, 2.5]}}
    quick = await client.post("/v1/tasks", json={**body, "prompt": f"Say {digits[:100]} x"})
    slow = await client.post("/v1/tasks", json=body)
    assert quick.status_code == slow.status_code == 202
    first, second = quick.json(), slow.json()
    assert second["prompt"] == body["prompt"]
    for key in ("id", "prompt", "created_at"):
        first.pop(key), second.pop(key)
    assert first == second


async def test_strict_input_accepts_what_the_contract_allows(client: httpx.AsyncClient) -> None:
    body = {
        "prompt": "Pick [[answers: 1]]",
        "mode": "fast",
        "task_type": "math",
        "priority": 0,
        "temperature": 1,  # an integer is a number
        "timeout_s": 30,
        "max_new_tokens": 64,
        "early_stop": False,
        "stop": ["\n\n"],
        "metadata": {"big": 10**99, "nested": [1.5, {"ok": None}]},
        "messages": None,
    }
    response = await client.post("/v1/tasks", json=body)
    assert response.status_code == 202, response.text
    assert response.json()["metadata"] == body["metadata"]
    assert response.json()["temperature"] == 1.0


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data", None]
)
async def test_a_body_not_sent_as_json_is_415(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = await client.post("/v1/tasks", content=b'{"prompt": "x"}', headers=headers)
    body = assert_error(response, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in body["error"]["message"]
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tasks", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "bad_request")


async def test_limits_give_413(client: httpx.AsyncClient, settings: Settings) -> None:
    long_prompt = "x" * (settings.max_prompt_chars + 1)
    assert_error(await client.post("/v1/tasks", json={"prompt": long_prompt}), 413, "too_large")
    huge = b'{"prompt": "' + b"y" * settings.max_body_bytes + b'"}'
    response = await client.post(
        "/v1/tasks", content=huge, headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "too_large")
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/tasks/1764412800123-nope-1"), 404, "not_found")
    assert_error(await client.get("/v1/tasks/garbage"), 404, "not_found")
    assert_error(await client.delete("/v1/tasks/1764412800123-nope-1"), 404, "not_found")
    assert_error(await client.get("/v1/nothing-here"), 404, "not_found")


async def test_idempotency_key(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "abc-123"}
    body = {"prompt": "same [[answers: 3]]", "mode": "fast"}
    first = await client.post("/v1/tasks", json=body, headers=headers)
    again = await client.post("/v1/tasks", json=body, headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = await client.post("/v1/tasks", json={**body, "priority": 1}, headers=headers)
    assert_error(other, 409, "conflict")
    assert len((await client.get("/v1/tasks")).json()["data"]) == 1


async def test_cancel_semantics(client: httpx.AsyncClient) -> None:
    running = (await client.post("/v1/tasks", json={"prompt": "[[hang]]"})).json()
    response = await client.delete(f"/v1/tasks/{running['id']}")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = await client.delete(f"/v1/tasks/{running['id']}")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    finished = (await client.post("/v1/tasks", json={"prompt": "[[answers: 1]]"})).json()
    await wait_for_task(client, finished["id"])
    body = assert_error(await client.delete(f"/v1/tasks/{finished['id']}"), 409, "conflict")
    assert body["task"]["status"] == "done"
    assert (await client.get(f"/v1/tasks/{running['id']}")).json()["status"] == "cancelled"


async def test_list_newest_first_with_cursor(client: httpx.AsyncClient) -> None:
    ids = []
    for i in range(5):
        r = await client.post("/v1/tasks", json={"prompt": f"{i} [[answers: 1]]", "mode": "fast"})
        ids.append(r.json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/tasks", params=params)).json()
        seen += [t["id"] for t in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    for task_id in ids:
        await wait_for_task(client, task_id)
    done = (await client.get("/v1/tasks", params={"status": "done", "limit": 100})).json()
    assert len(done["data"]) == 5
    assert_error(await client.get("/v1/tasks", params={"limit": 0}), 422, "invalid")
    assert_error(await client.get("/v1/tasks", params={"status": "bogus"}), 422, "invalid")


async def test_operations(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    task = (await client.post("/v1/tasks", json={"prompt": "[[answers: 1]]"})).json()
    await wait_for_task(client, task["id"])
    text = (await client.get("/metrics")).text
    for name in (
        "ponder_queue_depth",
        "ponder_tasks_finished_total",
        "ponder_batch_size_bucket",
        "ponder_batch_wait_seconds",
        "ponder_batch_run_seconds",
        "ponder_sample_latency_seconds",
        "ponder_webhook_deliveries_total",
    ):
        assert name in text
    assert (await client.get("/docs")).status_code == 200
    schema = (await client.get("/openapi.json")).json()
    assert "/v1/tasks" in schema["paths"]
    # the polled route is served by a plain route and documented by its FastAPI route
    assert set(schema["paths"]["/v1/tasks/{task_id}"]) == {"get", "delete"}


async def test_backpressure_is_atomic(settings: Settings) -> None:
    limited = settings.model_copy(update={"max_pending": 10})
    async with (
        LiveServer(limited, workers=0) as live,
        httpx.AsyncClient(base_url=live.url, timeout=20) as c,
    ):
        responses = await asyncio.gather(
            *(c.post("/v1/tasks", json={"prompt": f"p{i}"}) for i in range(50))
        )
        codes = sorted(r.status_code for r in responses)
        assert codes.count(202) == 10 and codes.count(503) == 40
        for r in responses:
            if r.status_code == 503:
                assert_error(r, 503, "queue_full")
                assert int(r.headers["retry-after"]) >= 1
        assert len((await c.get("/v1/tasks", params={"limit": 100})).json()["data"]) == 10
        not_ready = await c.get("/readyz")  # no worker in this process
        assert not_ready.status_code == 503


async def test_auth_and_isolation(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    keys = {"alice": "pk_alice_secret", "bob": "pk_bob_secret"}
    secured = settings.model_copy(update={"api_keys": [key_digest(k) for k in keys.values()]})
    async with LiveServer(secured, workers=1) as live:
        alice = httpx.AsyncClient(
            base_url=live.url, headers={"Authorization": f"Bearer {keys['alice']}"}
        )
        bob = httpx.AsyncClient(
            base_url=live.url, headers={"Authorization": f"Bearer {keys['bob']}"}
        )
        anon = httpx.AsyncClient(base_url=live.url)
        wrong = httpx.AsyncClient(base_url=live.url, headers={"Authorization": "Bearer nope"})
        async with alice, bob, anon, wrong:
            missing = await anon.post("/v1/tasks", json={"prompt": "x"})
            assert_error(missing, 401, "unauthorized")
            assert missing.headers["www-authenticate"] == "Bearer"
            invalid = await wrong.get("/v1/tasks")
            assert_error(invalid, 401, "unauthorized")
            assert invalid.headers["www-authenticate"] == 'Bearer error="invalid_token"'
            task = (await alice.post("/v1/tasks", json={"prompt": "[[answers: 1]]"})).json()
            assert_error(await bob.get(f"/v1/tasks/{task['id']}"), 404, "not_found")
            assert_error(await anon.get(f"/v1/tasks/{task['id']}"), 401, "unauthorized")
            assert_error(await bob.delete(f"/v1/tasks/{task['id']}"), 404, "not_found")
            assert (await bob.get("/v1/tasks")).json()["data"] == []
            assert (await wait_for_task(alice, task["id"]))["status"] == "done"
            assert (await anon.get("/healthz")).status_code == 200


async def test_embedded_store_survives_a_restart(sqlite_settings: Settings) -> None:
    """A task submitted before a restart is still there, and a pending one runs after it."""
    async with (
        LiveServer(sqlite_settings, workers=0) as live,
        httpx.AsyncClient(base_url=live.url) as c,
    ):
        task = (await c.post("/v1/tasks", json={"prompt": "[[answers: 9]]"})).json()
    async with (
        LiveServer(sqlite_settings, workers=1) as live,
        httpx.AsyncClient(base_url=live.url) as c,
    ):
        done = await wait_for_task(c, task["id"])
        assert done["status"] == "done" and done["result"]["answer"] == "9"
