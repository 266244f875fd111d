"""The transformers engine's own mechanics on the real SmolLM2-135M model: shared and
cached prompt prefill, chunked prefill, its checkpoint cache. The per-row contract (which
it shares with the default engine) is ``test_local_engines.py``'s.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.engines.base import SampleRequest
from ponder.engines.models import checkpoint_dir
from ponder.engines.transformers import TransformersEngine
from ponder.errors import ConfigError
from tests.engines.prompts import CAPITAL, HAIKU, STORY, greedy, run, same, sampled

pytestmark = pytest.mark.model


async def test_rows_sharing_a_prompt_prefill_it_once(hf_engine: TransformersEngine) -> None:
    assert hf_engine.batch_invariant
    haiku, capital = f"{HAIKU} ({uuid.uuid4().hex})", f"{CAPITAL} ({uuid.uuid4().hex})"
    rows = [greedy(haiku, 8), sampled(haiku, 1), sampled(haiku, 2, top_p=0.8), greedy(capital, 8)]
    lengths = [hf_engine.prompt_length(r) for r in (rows[0], rows[3])]
    before = copy.copy(hf_engine.stats)
    shared = await run(hf_engine, *rows)
    assert hf_engine.stats.prefill_tokens - before.prefill_tokens == sum(lengths)
    assert hf_engine.stats.prefix_hits - before.prefix_hits == 2  # two rows shared haiku
    # a later wave of the same prompt is not prefilled again (the prompt-KV cache)
    before = copy.copy(hf_engine.stats)
    again = [(await run(hf_engine, r))[0] for r in rows]
    assert hf_engine.stats.prefill_tokens == before.prefill_tokens
    assert hf_engine.stats.prefix_hits - before.prefix_hits == 4
    for a, b in zip(shared, again, strict=True):
        same(a, b)


@pytest.mark.timeout(240)
async def test_a_long_prompt_is_prefilled_in_chunks_between_steps(
    hf_engine: TransformersEngine,
) -> None:
    long_prompt = "Summarize: " + " ".join(f"item {i} is fine." for i in range(160))
    length = hf_engine.prompt_length(SampleRequest(prompt=long_prompt))
    assert length > 2 * hf_engine._step_tokens
    streaming = asyncio.Event()
    runner = asyncio.create_task(
        hf_engine.submit(
            SampleRequest(prompt=STORY, max_new_tokens=40, on_text=lambda _: streaming.set())
        )
    )
    await asyncio.wait_for(streaming.wait(), 30)  # the row is running
    steps_before = hf_engine.stats.steps
    chunked = await hf_engine.submit(greedy(long_prompt, 8))
    # the running row kept decoding while the prompt went in, one chunk per step
    assert hf_engine.stats.steps - steps_before >= length // hf_engine._step_tokens
    await runner
    whole = TransformersEngine(
        load_settings(engine="transformers", engine_threads=1, engine_step_tokens=4096)
    )
    try:
        unchunked = await whole.submit(greedy(long_prompt, 8))
    finally:
        await whole.close()
    same(chunked, unchunked)


async def test_a_wrong_model_is_a_one_line_config_error(tmp_path: Path) -> None:
    for model in [str(tmp_path / "missing.gguf"), str(tmp_path), "no-such-model"]:
        engine = TransformersEngine(
            load_settings(engine="transformers", model=model, model_cache_dir=str(tmp_path))
        )
        with pytest.raises(ConfigError) as caught:
            await engine.start()
        await engine.close()
        assert "\n" not in str(caught.value)
        assert "PONDER_MODEL" in str(caught.value)


def test_a_checkpoint_directory_is_used_as_is(hf_engine: TransformersEngine) -> None:
    # the session's engine has put the converted packaged model in the default cache
    entry = checkpoint_dir("smollm2-135m", load_settings().model_cache_dir)
    assert (entry / "model.safetensors").is_file()
    assert checkpoint_dir(str(entry), "/nonexistent-cache") == entry
