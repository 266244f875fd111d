"""Webhooks in OpenAI's shape for background responses and batches, delivered to a real
receiver on loopback and checked with the official SDK's ``webhooks.unwrap``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from ponder.config import Settings
from tests.api.test_batches import CHAT, chat_line, until, upload
from tests.conftest import LiveServer
from tests.test_expiry import worker_side
from tests.test_webhooks import SECRET, Receiver, sender_settings

pytestmark = pytest.mark.timeout(60)


def hook_settings(settings: Settings, **overrides: Any) -> Settings:
    return sender_settings(settings, batch_tick_s=0.02, **overrides)


async def next_delivery(receiver: Receiver, timeout_s: float = 20) -> tuple[dict[str, str], bytes]:
    async with asyncio.timeout(timeout_s):
        count = await receiver.arrived.get()
    return receiver.requests[count - 1]


def unwrap(sdk: AsyncOpenAI, delivery: tuple[dict[str, str], bytes]) -> Any:
    headers, body = delivery
    return sdk.webhooks.unwrap(body, headers, secret=SECRET)


async def test_response_and_batch_webhooks_unwrap_with_the_sdk(settings: Settings) -> None:
    async with (
        Receiver([500, 200]) as receiver,
        LiveServer(hook_settings(settings), workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(
            model="ponder-fast",
            input="[[answers: 4]]",
            background=True,
            extra_body={"webhook_url": receiver.url},
        )
        failed_attempt = await next_delivery(receiver)  # answered 500: sent again
        headers, body = await next_delivery(receiver)
        assert headers["webhook-id"] == failed_attempt[0]["webhook-id"]  # the same event
        event = sdk.webhooks.unwrap(body, headers, secret=SECRET)
        assert event.type == "response.completed" and event.data.id == response.id
        assert event.object == "event" and event.id == headers["webhook-id"]
        assert json.loads(body) == {
            "id": event.id,
            "object": "event",
            "type": "response.completed",
            "created_at": event.created_at,
            "data": {"id": response.id},  # thin: the receiver fetches the response
        }
        assert (await sdk.responses.retrieve(event.data.id)).status == "completed"
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.unwrap(body.replace(b"completed", b"cancelled"), headers, secret=SECRET)

        cancelled = await sdk.responses.create(
            model="ponder", input="[[hang]]", background=True,
            extra_body={"webhook_url": receiver.url},
        )  # fmt: skip
        await sdk.responses.cancel(cancelled.id)
        event = unwrap(sdk, await next_delivery(receiver))
        assert (event.type, event.data.id) == ("response.cancelled", cancelled.id)

        batch = await sdk.batches.create(
            input_file_id=await upload(sdk, [chat_line("a", "[[answers: 1]]")]),
            endpoint=CHAT,
            completion_window="24h",
            extra_body={"webhook_url": receiver.url},
        )
        event = unwrap(sdk, await next_delivery(receiver))
        assert (event.type, event.data.id) == ("batch.completed", batch.id)
        assert (await until(sdk, batch.id)).status == "completed"
        # responses that wait (not background) send none
        await sdk.responses.create(
            model="ponder-fast", input="[[answers: 1]]", extra_body={"webhook_url": receiver.url}
        )
        await asyncio.sleep(0.3)
        assert receiver.arrived.empty()


async def test_a_response_that_expired_in_the_queue_sends_response_failed(
    settings: Settings,
) -> None:
    config = hook_settings(settings)
    async with (
        Receiver([200]) as receiver,
        LiveServer(config, workers=0) as live,  # no worker serves the model
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(
            model="ponder",
            input="x",
            background=True,
            extra_body={"webhook_url": receiver.url, "queue_timeout_s": 0.1},
        )
        async with worker_side(config):
            event = unwrap(sdk, await next_delivery(receiver))
        assert (event.type, event.data.id) == ("response.failed", response.id)
        failed = await sdk.responses.retrieve(event.data.id)
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.code == "queue_timeout"  # type: ignore[comparison-overlap]


async def test_the_configured_webhook_url_and_a_failed_batch(settings: Settings) -> None:
    async with Receiver([200]) as receiver:
        configured = hook_settings(settings, webhook_url=receiver.url)
        async with (
            LiveServer(configured, workers=1) as live,
            AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
        ):
            duplicate = [chat_line("a", "x"), chat_line("a", "x")]
            batch = await sdk.batches.create(
                input_file_id=await upload(sdk, duplicate), endpoint=CHAT, completion_window="24h"
            )
            event = unwrap(sdk, await next_delivery(receiver))
            assert (event.type, event.data.id) == ("batch.failed", batch.id)
            assert (await sdk.batches.retrieve(batch.id)).status == "failed"


async def test_a_webhook_url_needs_a_secret_and_a_public_host(settings: Settings) -> None:
    async with (
        LiveServer(settings.model_copy(update={"batch_tick_s": 0.02}), workers=0) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.UnprocessableEntityError) as info:
            await sdk.responses.create(
                model="ponder", input="x", background=True,
                extra_body={"webhook_url": "https://example.com/hook"},
            )  # fmt: skip
        assert "PONDER_WEBHOOK_SECRET" in info.value.message
    private = hook_settings(settings, callback_allow_private=False)
    async with (
        LiveServer(private, workers=0) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.UnprocessableEntityError) as info:
            await sdk.batches.create(
                input_file_id=await upload(sdk, [chat_line("a", "x")]),
                endpoint=CHAT,
                completion_window="24h",
                extra_body={"webhook_url": "http://127.0.0.1:9/hook"},
            )
        body: Any = info.value.body
        assert body["param"] == "webhook_url" and "loopback" in body["message"]
