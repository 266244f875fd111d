"""The Files and Batch APIs, driven by the official ``openai`` SDK against a live server on
both stores: a 200-line batch, bad lines, cancel and expiry with the finished lines kept,
a restart of every process, the batch lines' own backlog, tenancy and errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from ponder.config import Settings
from ponder.store import create_store
from tests.api.sdk import fast_settings, retrieve_until
from tests.conftest import LiveServer
from tests.test_expiry import worker_side

pytestmark = pytest.mark.timeout(90)

CHAT = "/v1/chat/completions"
ENDED = ("completed", "failed", "cancelled", "expired")


@contextlib.asynccontextmanager
async def serving(settings: Settings, workers: int = 1) -> AsyncIterator[AsyncOpenAI]:
    """The service on loopback and an SDK client of it."""
    async with (
        LiveServer(settings, workers=workers) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        yield sdk


def chat_line(custom_id: str, prompt: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "ponder-fast", "messages": messages, **body},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


async def upload(sdk: AsyncOpenAI, lines: list[dict[str, Any]]) -> str:
    file = await sdk.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return file.id


async def until(sdk: AsyncOpenAI, batch_id: str, statuses: tuple[str, ...] = ENDED,
                timeout_s: float = 60) -> Any:  # fmt: skip
    """What a Batch API client does: retrieve until the batch reaches one of ``statuses``."""
    return await retrieve_until(sdk.batches.retrieve, batch_id, statuses, timeout_s, 0.05)


async def until_completed(sdk: AsyncOpenAI, batch_id: str, count: int) -> None:
    """Until at least ``count`` lines of the batch have completed."""
    async with asyncio.timeout(30):
        while True:
            counts = (await sdk.batches.retrieve(batch_id)).request_counts
            if counts is not None and counts.completed >= count:
                return
            await asyncio.sleep(0.02)


async def read_file(sdk: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await sdk.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def test_a_batch_of_200_lines_completes(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    lines = [chat_line(f"req-{i}", f"[[answers: {i}]]") for i in range(200)]
    file_id = await upload(sdk, lines)
    file = await sdk.files.retrieve(file_id)
    assert file.purpose == "batch" and file.bytes == len(jsonl(lines))
    batch = await sdk.batches.create(
        input_file_id=file_id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = await until(sdk, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (200, 200)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = await read_file(sdk, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(200))
    for entry in output:
        assert entry["error"] is None and entry["response"]["status_code"] == 200
        body = entry["response"]["body"]
        assert body["object"] == "chat.completion"
        i = entry["custom_id"].removeprefix("req-")
        assert body["choices"][0]["message"]["content"].endswith(f"The answer is {i}.")
        assert body["ponder"]["answer"] == i
    assert done.usage is not None
    assert done.usage.output_tokens == sum(
        o["response"]["body"]["usage"]["completion_tokens"] for o in output
    )
    # each line ran as a task at the batch priority, tagged with its batch
    task = await client.get(f"/v1/tasks/{output[0]['response']['body']['ponder']['task_id']}")
    assert task.json()["priority"] == 5
    assert task.json()["metadata"] == {"batch_id": batch.id, "custom_id": output[0]["custom_id"]}
    assert [b.id async for b in sdk.batches.list()] == [batch.id]
    assert (await sdk.files.retrieve(done.output_file_id)).purpose == "batch_output"


async def test_a_batch_of_responses(sdk: AsyncOpenAI) -> None:
    body = {"model": "ponder-fast", "instructions": "Be brief."}
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
         "body": {**body, "input": f"[[answers: {i}]]"}}
        for i in range(5)
    ]  # fmt: skip
    # a line may name the auto mode and its budget
    lines[4]["body"] |= {"model": "ponder-auto", "max_samples": 2, "target_confidence": 1.0}
    batch = await sdk.batches.create(
        input_file_id=await upload(sdk, lines), endpoint="/v1/responses", completion_window="24h"
    )
    done = await until(sdk, batch.id)
    output = await read_file(sdk, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == [f"r{i}" for i in range(5)]
    body = next(o for o in output if o["custom_id"] == "r3")["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"].endswith("The answer is 3.")
    auto = next(o for o in output if o["custom_id"] == "r4")["response"]["body"]
    assert auto["model"] == "ponder-auto" and auto["ponder"]["stop_reason"] == "budget"
    assert auto["ponder"]["stage"] == 2


async def test_bad_lines(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    # a line that is not JSON is refused at upload, with its line number
    raw = jsonl([chat_line("a", "x")]) + b"{not json\n"
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.files.create(file=("bad.jsonl", raw), purpose="batch")
    assert "line 2" in info.value.message and info.value.body["code"] == "invalid_file"  # type: ignore[index]
    # lines that cannot belong to the batch fail it at validation, each with its line
    wrong = [
        chat_line("a", "[[answers: 1]]"),
        chat_line("a", "[[answers: 2]]"),
        {**chat_line("b", "x"), "url": "/v1/embeddings"},
        {"method": "POST", "url": CHAT, "body": {}},
    ]
    failed = await until(
        sdk, (await sdk.batches.create(input_file_id=await upload(sdk, wrong),
                                       endpoint=CHAT, completion_window="24h")).id,
    )  # fmt: skip
    assert failed.status == "failed" and failed.failed_at and failed.errors is not None
    errors = [(e.line, e.code, e.param) for e in failed.errors.data or []]
    assert errors == [
        (2, "duplicate_custom_id", "custom_id"),
        (3, "mismatched_url", "url"),
        (4, "invalid_custom_id", "custom_id"),
    ]
    assert failed.output_file_id is None and failed.error_file_id is None
    # a request the endpoint would refuse is a line of the error file; the others run
    mixed = [
        chat_line("ok-1", "[[answers: 1]]"),
        chat_line("too-hot", "x", temperature=5),
        chat_line("fails", "[[fail]]"),
        chat_line("ok-2", "[[answers: 2]]"),
        chat_line("unknown-model", "x", model="gpt-4o"),
    ]
    done = await until(
        sdk, (await sdk.batches.create(input_file_id=await upload(sdk, mixed),
                                       endpoint=CHAT, completion_window="24h")).id,
    )  # fmt: skip
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 3)
    assert sorted(o["custom_id"] for o in await read_file(sdk, done.output_file_id)) == [
        "ok-1",
        "ok-2",
    ]
    errors_by_id = {e["custom_id"]: e for e in await read_file(sdk, done.error_file_id)}
    hot = errors_by_id["too-hot"]["response"]
    assert hot["status_code"] == 422
    assert hot["body"]["error"]["param"] == "body.temperature"
    assert hot["body"]["error"]["message"].startswith("line 2: body.temperature")
    unknown = errors_by_id["unknown-model"]["response"]
    assert unknown["status_code"] == 404
    assert unknown["body"]["error"]["code"] == "model_not_found"
    assert unknown["body"]["error"]["message"].startswith("line 5: body.model")
    failure = errors_by_id["fails"]["response"]
    assert failure["status_code"] == 500 and failure["body"]["error"]["code"] == "engine_error"


async def test_a_batch_cancelled_midway_keeps_its_finished_lines(settings: Settings) -> None:
    lines = [chat_line(f"c{i}", "[[answers: 7]] [[sleep_ms: 100]]") for i in range(40)]
    slow = fast_settings(settings, batch_max_in_flight=4)
    async with serving(slow) as sdk:
        batch = await sdk.batches.create(
            input_file_id=await upload(sdk, lines), endpoint=CHAT, completion_window="24h"
        )
        await until_completed(sdk, batch.id, 6)
        cancelling = await sdk.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at
        done = await until(sdk, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        assert done.request_counts is not None
        finished = done.request_counts.completed
        assert 6 <= finished < 40 and done.request_counts.failed == 0
        output = await read_file(sdk, done.output_file_id)
        errors = await read_file(sdk, done.error_file_id)
        assert len(output) == finished
        assert all(o["response"]["status_code"] == 200 for o in output)
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        assert sorted(o["custom_id"] for o in output + errors) == sorted(f"c{i}" for i in range(40))
        with pytest.raises(openai.ConflictError):
            completed_batch = await sdk.batches.create(
                input_file_id=await upload(sdk, lines[:1]), endpoint=CHAT, completion_window="24h"
            )
            await until(sdk, completed_batch.id)
            await sdk.batches.cancel(completed_batch.id)
        assert (await sdk.batches.cancel(batch.id)).status == "cancelled"  # again: as it is


async def test_an_expired_batch_keeps_its_finished_lines(settings: Settings) -> None:
    lines = [chat_line(f"f{i}", "[[answers: 1]]") for i in range(3)]
    lines += [chat_line(f"h{i}", "[[hang]]") for i in range(3)]
    # three in flight: the lines that hang start only after the others finished
    async with serving(fast_settings(settings, batch_max_in_flight=3)) as sdk:
        batch = await sdk.batches.create(
            input_file_id=await upload(sdk, lines),
            endpoint=CHAT,
            completion_window="2s",  # type: ignore[arg-type]  # ponder: shorter windows
        )
        done = await until(sdk, batch.id)
        output = await read_file(sdk, done.output_file_id)
        errors = await read_file(sdk, done.error_file_id)
    assert done.status == "expired" and done.expired_at
    assert sorted(o["custom_id"] for o in output) == ["f0", "f1", "f2"]
    assert sorted(e["custom_id"] for e in errors) == ["h0", "h1", "h2"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_lines_not_started_in_time_are_queue_timeout_errors(settings: Settings) -> None:
    """No worker serves the model and PONDER_QUEUE_TIMEOUT_S is 0.2 s: each line's task
    expires; each is a line of the error file (``queue_timeout``), counted as failed, and
    the batch completes."""
    config = fast_settings(settings, queue_timeout_s=0.2)
    lines = [chat_line(f"q{i}", "[[answers: 1]]") for i in range(3)]
    async with serving(config, workers=0) as sdk:
        batch = await sdk.batches.create(
            input_file_id=await upload(sdk, lines), endpoint=CHAT, completion_window="24h"
        )
        async with worker_side(config):
            done = await until(sdk, batch.id)
        errors = await read_file(sdk, done.error_file_id)
    assert done.status == "completed" and done.output_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (3, 0)
    assert done.request_counts.failed == 3
    assert sorted(e["custom_id"] for e in errors) == ["q0", "q1", "q2"]
    for entry in errors:
        assert entry["response"] is None and entry["error"]["code"] == "queue_timeout"
        assert "0.2s queue_timeout_s" in entry["error"]["message"]


async def test_a_batch_survives_a_restart_of_every_process(settings: Settings) -> None:
    lines = [chat_line(f"s{i}", f"[[answers: {i}]] [[sleep_ms: 20]]") for i in range(60)]
    slow = fast_settings(settings, batch_max_in_flight=4)
    async with serving(slow) as sdk:
        batch = await sdk.batches.create(
            input_file_id=await upload(sdk, lines), endpoint=CHAT, completion_window="24h"
        )
        await until_completed(sdk, batch.id, 5)
    # every process stopped midway (API, workers, feeder); a new one carries on
    async with serving(slow) as sdk:
        done = await until(sdk, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 60
        output = await read_file(sdk, done.output_file_id)
    ids = [o["custom_id"] for o in output]
    assert sorted(ids) == sorted(f"s{i}" for i in range(60))  # each line once
    tasks = {o["response"]["body"]["ponder"]["task_id"] for o in output}
    assert len(tasks) == 60  # one task per line, none run twice


async def test_batch_lines_never_make_interactive_submits_see_queue_full(
    settings: Settings,
) -> None:
    """The batch lines pending wait in a backlog of their own: interactive submits are
    admitted up to PONDER_MAX_PENDING exactly as without the batch."""
    tight = fast_settings(settings, max_pending=3, worker_max_tasks=1, batch_max_in_flight=4,
                          batch_interactive_share=1.0)  # fmt: skip
    store = create_store(tight)
    await store.start()
    try:
        async with (
            LiveServer(tight, workers=1) as live,
            httpx.AsyncClient(base_url=live.url) as client,
            AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
        ):
            lines = [chat_line(f"q{i}", "[[hang]]") for i in range(10)]
            batch = await sdk.batches.create(
                input_file_id=await upload(sdk, lines), endpoint=CHAT, completion_window="24h"
            )
            async with asyncio.timeout(10):  # one line runs (the only slot), three wait
                while True:  # (the feeder adds lines one by one: wait for the settled state)
                    running = (await client.get("/v1/tasks?status=running")).json()["data"]
                    if len(running) == 1 and await store.batch_pending_count() == 3:
                        break
                    await asyncio.sleep(0.02)
            assert await store.pending_count() == 3  # the backlog is "full" of batch lines
            accepted = [await client.post("/v1/tasks", json={"prompt": "x"}) for _ in range(3)]
            assert [r.status_code for r in accepted] == [202, 202, 202]
            refused = await client.post("/v1/tasks", json={"prompt": "x"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
            assert await store.batch_pending_count() == 3  # no more lines while it is full
            await sdk.batches.cancel(batch.id)  # its queued lines are cancelled
            # the line that runs would run on (a cancelled batch lets them finish): stop it
            for task in (await client.get("/v1/tasks?status=running")).json()["data"]:
                await client.delete(f"/v1/tasks/{task['id']}")
            assert (await until(sdk, batch.id)).status == "cancelled"
            for r in accepted:
                await client.delete(f"/v1/tasks/{r.json()['id']}")
    finally:
        await store.close()


async def test_files_and_batches_errors(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.files.create(file=("x.jsonl", jsonl([chat_line("a", "x")])), purpose="fine-tune")
    assert info.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        await sdk.files.create(file=("e.jsonl", b"\n\n"), purpose="batch")  # no requests
    with pytest.raises(openai.BadRequestError):
        await sdk.files.create(file=("b.jsonl", b"\xff\xfe"), purpose="batch")
    r = await client.post("/v1/files", json={"purpose": "batch"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    file_id = await upload(sdk, [chat_line("a", "[[answers: 1]]")])
    bad_requests: list[tuple[dict[str, Any], int, str | None]] = [
        ({"endpoint": "/v1/embeddings"}, 422, "endpoint"),
        ({"completion_window": "48h"}, 422, "completion_window"),
        ({"input_file_id": "file-nope"}, 404, None),
        ({"metadata": {str(i): "v" for i in range(17)}}, 422, "metadata"),
    ]
    for change, status, param in bad_requests:
        body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **change}
        r = await client.post("/v1/batches", json=body)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param
    for missing in (sdk.batches.retrieve("batch_x"), sdk.batches.cancel("batch_x"),
                    sdk.files.retrieve("file-x"), sdk.files.content("file-x")):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            await missing
    deleted = await sdk.files.delete(file_id)
    assert deleted.deleted and deleted.id == file_id
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(file_id)
    assert [b async for b in sdk.batches.list()] == []


async def test_file_limits(settings: Settings) -> None:
    small = fast_settings(settings, files_max_bytes=2048, batch_max_lines=3)
    async with serving(small, workers=0) as sdk:
        four = jsonl([chat_line(str(i), "x") for i in range(4)])
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.files.create(file=("x.jsonl", four), purpose="batch")
        assert "line 4" in info.value.message and "3 requests" in info.value.message
        big = jsonl([chat_line("a", "x" * 3000)])
        with pytest.raises(openai.APIStatusError) as status:
            await sdk.files.create(file=("big.jsonl", big), purpose="batch")
        assert status.value.status_code == 413
        ok = await sdk.files.create(
            file=("ok.jsonl", jsonl([chat_line("a", "x")])), purpose="batch"
        )
        assert ok.bytes < 2048


async def test_files_in_a_directory(settings: Settings, tmp_path: Any) -> None:
    stored = fast_settings(settings, files_dir=str(tmp_path / "files"))
    async with serving(stored) as sdk:
        lines = [chat_line(f"d{i}", f"[[answers: {i}]]") for i in range(3)]
        file_id = await upload(sdk, lines)
        assert (tmp_path / "files" / file_id).read_bytes() == jsonl(lines)
        done = await until(sdk, (await sdk.batches.create(
            input_file_id=file_id, endpoint=CHAT, completion_window="24h")).id)  # fmt: skip
        assert (tmp_path / "files" / str(done.output_file_id)).exists()
        assert len(await read_file(sdk, done.output_file_id)) == 3
        await sdk.files.delete(file_id)
        assert not (tmp_path / "files" / file_id).exists()


async def test_a_key_sees_only_its_own_files_and_batches(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = fast_settings(settings, api_keys=[key_digest("a"), key_digest("b")])
    async with (
        LiveServer(secured, workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="a", max_retries=0) as alice,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="b", max_retries=0) as bob,
    ):
        file_id = await upload(alice, [chat_line("a", "[[answers: 1]]")])
        batch = await alice.batches.create(input_file_id=file_id, endpoint=CHAT,
                                           completion_window="24h")  # fmt: skip
        for call in (
            bob.files.retrieve(file_id),
            bob.files.content(file_id),
            bob.files.delete(file_id),
            bob.batches.retrieve(batch.id),
            bob.batches.cancel(batch.id),
            bob.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h"),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        assert [b async for b in bob.batches.list()] == []
        assert [f async for f in bob.files.list()] == []
        done = await until(alice, batch.id)
        with pytest.raises(openai.NotFoundError):
            await bob.files.content(str(done.output_file_id))
        assert len(await read_file(alice, done.output_file_id)) == 1
