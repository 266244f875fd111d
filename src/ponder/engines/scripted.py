"""A deterministic engine for tests and scheduler benchmarks — never a model substitute.

Directives in the prompt steer it, so black-box tests can script outcomes:

- ``[[answers: 42, 42, 17]]`` — sample *i* answers the *i*-th value (cycling); the values
  ``fail`` and ``hang`` make that one sample raise an engine error or never return.
- ``[[sleep_ms: N]]`` — each call on this item takes N ms more.
- ``[[fail]]`` — every sample raises an engine error.
- ``[[hang]]`` — every sample never returns until cancelled or timed out.
- ``[[poison]]`` — a batch holding this item fails as a whole (tests batch isolation).

Without ``answers`` the answer is a number derived from the prompt, so it is stable.
``PONDER_SCRIPTED_BATCH_MS="base,per_item"`` adds ``base + per_item * len(batch)`` ms per
call: a latency model of a batched accelerator.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence

from ponder.config import Settings
from ponder.engines.base import BaseEngine, BatchResult, SampleOutput, SampleRequest
from ponder.errors import EngineError

__all__ = ["ScriptedEngine", "parse_directives"]

_DIRECTIVE_RE = re.compile(r"\[\[\s*([a-z_]+)\s*(?::\s*([^\]]*))?\]\]")


def parse_directives(text: str) -> dict[str, str]:
    """``{"answers": "42, 17", "fail": ""}`` from the ``[[...]]`` directives in ``text``."""
    return {m[1]: (m[2] or "").strip() for m in _DIRECTIVE_RE.finditer(text)}


class ScriptedEngine(BaseEngine):
    """Answers from directives after a modelled batch latency. See the module docstring."""

    name = "scripted"
    model_name = "scripted"

    def __init__(self, settings: Settings | None = None, *, batch_ms: Sequence[float] = (0, 0)):
        base_ms, per_item_ms = settings.scripted_batch_ms if settings else batch_ms
        self.base_ms = float(base_ms)
        self.per_item_ms = float(per_item_ms)
        #: every batch this engine ran, as the number of rows (tests read it)
        self.batch_sizes: list[int] = []

    def batch_latency_s(self, size: int) -> float:
        return (self.base_ms + self.per_item_ms * size) / 1000

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        self.batch_sizes.append(len(batch))
        directives = [parse_directives(_prompt_text(r)) for r in batch]
        if any("poison" in d for d in directives):
            raise EngineError("scripted: a poisonous request failed the batch")
        latency = self.batch_latency_s(len(batch))
        if latency > 0:
            await asyncio.sleep(latency)
        results = await asyncio.gather(
            *(self._one(r, d) for r, d in zip(batch, directives, strict=True)),
            return_exceptions=True,
        )
        out: BatchResult = []
        for item in results:
            if isinstance(item, SampleOutput | EngineError):
                out.append(item)
            elif isinstance(item, BaseException):
                raise item
        return out

    async def _one(self, request: SampleRequest, directives: dict[str, str]) -> SampleOutput:
        sleep_ms = float(directives.get("sleep_ms") or 0)
        if sleep_ms > 0:
            await asyncio.sleep(sleep_ms / 1000)
        answer = _answer_for(request, directives)
        if answer == "fail":
            raise EngineError(f"scripted failure of sample {request.sample_index}")
        if answer == "hang":
            await _until_cancelled(request)
            return SampleOutput(text="", finish_reason="cancelled")
        text = f"Let me work through this step by step. The answer is {answer}."
        return SampleOutput(
            text=text,
            prompt_tokens=len(_prompt_text(request).split()),
            completion_tokens=len(text.split()),
            finish_reason="stop",
            mean_logprob=-0.25,
        )


def _prompt_text(request: SampleRequest) -> str:
    if request.messages is not None:
        return "\n".join(str(m.get("content", "")) for m in request.messages)
    return request.prompt or ""


def _answer_for(request: SampleRequest, directives: dict[str, str]) -> str:
    if "fail" in directives:
        return "fail"
    if "hang" in directives:
        return "hang"
    values = [v.strip() for v in directives.get("answers", "").split(",") if v.strip()]
    if values:
        return values[request.sample_index % len(values)]
    digest = hashlib.sha256(_prompt_text(request).encode()).digest()
    return str(int.from_bytes(digest[:4], "big") % 1000)


async def _until_cancelled(request: SampleRequest) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not done.done():
            done.set_result(None)

    request.on_cancel(lambda: loop.call_soon_threadsafe(settle))

    await done
