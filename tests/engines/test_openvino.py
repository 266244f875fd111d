"""The openvino engine's own mechanics on the real SmolLM2-135M model and a real engine
process: what it reports, a preempted sampled row, the process dying under its rows, a
file that is not a model, a KV cache too small for a prompt, its choice of weights, and
what it imports. The per-row contract is ``test_local_engines.py``'s; its cache entry,
``test_models.py``'s.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.engines.base import SampleRequest
from ponder.engines.openvino import OpenVINOEngine
from ponder.errors import ConfigError, EngineError
from tests.engines.prompts import (
    CAPITAL,
    HAIKU,
    STORY,
    failed,
    greedy,
    ok,
    preempted,
    run,
    same,
    sampled,
)

pytestmark = pytest.mark.model


def small_engine(**overrides: object) -> OpenVINOEngine:
    """An engine of the test's own (one thread), for what must not touch the session's."""
    return OpenVINOEngine(load_settings(engine="openvino", engine_threads=1, **overrides))


def gone(pid: int) -> bool:
    """Whether no process has ``pid`` any more (the engine reaped its process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def wait_until(check: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    """Poll ``check()`` until it is true (AssertionError naming ``what`` at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        await asyncio.sleep(0.02)


async def test_it_counts_generated_tokens_and_names_its_weights_and_process(
    model_engine: OpenVINOEngine,
) -> None:
    before = copy.copy(model_engine.stats)
    outputs = await run(model_engine, greedy(CAPITAL, 8), greedy(HAIKU, 5))
    stats = model_engine.stats
    assert stats.tokens - before.tokens == sum(o.completion_tokens for o in outputs)
    assert stats.admitted - before.admitted == 2
    # the pipeline prefills (and reuses cached prompt blocks) in the process: not counted here
    assert (stats.prefill_tokens, stats.prefix_hits) == (before.prefill_tokens, before.prefix_hits)
    described = model_engine.describe()
    assert described["weights"] == "f16"
    assert described["process_pid"] == model_engine.process_pid != os.getpid()
    assert described["process_restarts"] == 0
    assert described["tokens"] == stats.tokens


async def test_a_preempted_sampled_row_continues_from_its_tokens(
    model_engine: OpenVINOEngine,
) -> None:
    """A greedy row resumes with the same text (``test_local_engines``); a sampled one is
    re-added with its tokens so far and a seed moved on by their number: its beginning is
    the one it had, the rest is another draw."""
    engine = model_engine
    alone = await engine.submit(sampled(HAIKU, 21, max_new_tokens=40))
    assert alone.completion_tokens > 20  # long enough to be preempted on its way
    head, resumed, pieces = await preempted(engine, sampled(HAIKU, 21, max_new_tokens=40))
    assert head and alone.text.startswith(head) and resumed.text.startswith(head)
    # where it ends depends on where it was preempted: at its budget or at an end of text
    assert resumed.finish_reason in ("stop", "length")
    assert resumed.token_logprobs is not None
    assert len(resumed.token_logprobs) == resumed.completion_tokens
    assert "".join(pieces) == resumed.text
    assert resumed.text != alone.text


@pytest.mark.timeout(300)
async def test_a_killed_engine_process_restarts_and_its_rows_resume_once() -> None:
    engine = small_engine()
    await engine.start()
    pids = [engine.process_pid]
    try:
        story_alone, haiku_alone = await run(engine, greedy(STORY, 40), greedy(HAIKU, 40))

        # killed mid-decode: both rows resume in a new process and complete
        pieces: list[str] = []
        streaming = asyncio.Event()

        def listen(piece: str) -> None:
            pieces.append(piece)
            streaming.set()

        story = SampleRequest(prompt=STORY, max_new_tokens=40, on_text=listen)
        rows = asyncio.gather(engine.submit(story), engine.submit(sampled(HAIKU, 5, 1.0, 40)))
        await asyncio.wait_for(streaming.wait(), 30)
        os.kill(pids[-1], signal.SIGKILL)
        resumed, seeded = await asyncio.wait_for(rows, 120)
        same(story_alone, resumed)  # a greedy row goes on as it would have
        assert "".join(pieces) == resumed.text  # and its stream neither repeats nor skips
        assert seeded.text and seeded.finish_reason in ("stop", "length")
        assert engine.describe()["process_restarts"] == 1
        pids.append(engine.process_pid)
        assert pids[-1] not in pids[:-1] and gone(pids[0])

        # killed again under a row that already survived a death: that row fails; a row
        # the process died under for the first time resumes
        survivor_pieces: list[str] = []
        survivor = asyncio.create_task(
            engine.submit(
                SampleRequest(prompt=STORY, max_new_tokens=300, on_text=survivor_pieces.append)
            )
        )
        await wait_until(lambda: survivor_pieces, "the row to start")
        os.kill(pids[-1], signal.SIGKILL)
        await wait_until(lambda: engine.describe()["process_restarts"] == 2, "a new process")
        resumed_at = len(survivor_pieces)
        await wait_until(lambda: len(survivor_pieces) > resumed_at, "the row to resume")
        fresh_started = asyncio.Event()
        fresh = asyncio.create_task(
            engine.submit(
                SampleRequest(
                    prompt=HAIKU, max_new_tokens=40, on_text=lambda _: fresh_started.set()
                )
            )
        )
        await asyncio.wait_for(fresh_started.wait(), 30)
        assert not survivor.done()
        pids.append(engine.process_pid)
        os.kill(pids[-1], signal.SIGKILL)
        with pytest.raises(EngineError) as caught:
            await asyncio.wait_for(survivor, 120)
        assert "process died (signal 9)" in str(caught.value)
        same(haiku_alone, ok(await asyncio.wait_for(fresh, 120)))

        # and the engine serves on
        (after,) = await run(engine, greedy(CAPITAL, 8))
        assert "Paris" in after.text
        assert engine.describe()["process_restarts"] == 3
        pids.append(engine.process_pid)
    finally:
        await engine.close()
    assert engine.process_pid is None
    assert all(gone(pid) for pid in pids if pid is not None)


@pytest.mark.timeout(120)
async def test_a_file_that_is_not_a_model_is_a_one_line_config_error(
    tmp_path: Path, tokenizer_only_gguf: Path
) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model at all\n" * 64)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    cases = {
        # refused on this side
        str(garbage): "cannot read the GGUF file",
        str(tmp_path / "missing.gguf"): "PONDER_MODEL",
        "no-such-model": "PONDER_MODEL",
        str(checkpoint): "PONDER_ENGINE=transformers",
        # refused by the pipeline in the engine process
        str(tokenizer_only_gguf): "the openvino engine cannot load",
    }
    for model, fragment in cases.items():
        engine = small_engine(model=model, model_cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ConfigError) as caught:
            await engine.start()
        await engine.close()
        message = str(caught.value)
        assert fragment in message, message
        assert "\n" not in message and "Traceback" not in message
        assert engine.process_pid is None


async def test_a_gguf_file_without_metadata_is_a_one_line_config_error(tmp_path: Path) -> None:
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # version 3, no tensors, no keys
    engine = small_engine(model=str(bare), model_cache_dir=str(tmp_path / "cache"))
    try:
        with pytest.raises(ConfigError) as caught:
            await engine.start()
    finally:
        await engine.close()
    assert "general.architecture" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.timeout(120)
async def test_a_prompt_over_the_kv_cache_fails_alone_and_an_answer_stops_at_its_end() -> None:
    engine = small_engine(engine_kv_tokens=64, engine_max_rows=1)
    await engine.start()
    try:
        long_prompt = "Summarize: " + " ".join(f"item {i} is fine." for i in range(40))
        assert engine.prompt_length(SampleRequest(prompt=long_prompt)) > 64
        results = await engine.generate([greedy(long_prompt, 4), greedy("Hi", 4)])
        error = failed(results[0])
        assert "the KV cache holds 64" in str(error) and "PONDER_ENGINE_KV_TOKENS" in str(error)
        assert ok(results[1]).completion_tokens == 4
        # a prompt that fits but whose answer would not: the row ends at the cache's end
        # with its text (not an error)
        (story,) = await run(engine, greedy(STORY, 60))
        assert story.finish_reason == "length" and story.text
        assert story.prompt_tokens + story.completion_tokens == 64
        (again,) = await run(engine, greedy("Hi", 4))  # the engine serves on
        same(again, ok(results[1]))
        assert engine.describe()["process_restarts"] == 0  # the process did not die
    finally:
        await engine.close()


def test_the_weights_are_f16_unless_gguf_is_asked_for() -> None:
    # f16: the float32 model's answers, and the same text alone and in any batch
    assert load_settings().engine_weights == "f16"
    assert OpenVINOEngine(load_settings()).batch_invariant
    # nothing loads before start()
    engine = OpenVINOEngine(load_settings(model="qwen0.5b", engine_weights="gguf"))
    assert (engine.weights, engine.batch_invariant, engine.process_pid) == ("gguf", False, None)


_IMPORTS_PROBE = """
import asyncio, json, os, sys
from ponder.config import load_settings
from ponder.engines.base import SampleRequest
from ponder.engines.models import PACKAGED_MODELS
from ponder.engines.openvino import OpenVINOEngine

# the engine process inherits this stderr and, read at its start, this variable: it logs
# every module it imports (-X importtime) into the file
os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
log = open(sys.argv[1], "w")
os.dup2(log.fileno(), 2)

async def main():
    engine = OpenVINOEngine(load_settings(engine="openvino", engine_threads=1))
    try:
        output = await engine.submit(SampleRequest(prompt="Hi", max_new_tokens=2))
        with open(f"/proc/{engine.process_pid}/maps") as maps:
            libraries = sorted({line.split()[-1] for line in maps if "/" in line})
    finally:
        await engine.close()
    print(json.dumps({"tokens": output.completion_tokens, "modules": sorted(sys.modules),
                      "libraries": libraries}))

asyncio.run(main())
"""


def _heavy(name: str) -> bool:
    return name.split(".")[0] in ("torch", "transformers")


@pytest.mark.timeout(180)
def test_the_engine_and_its_process_import_no_torch(tmp_path: Path) -> None:
    log = tmp_path / "imports.log"
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE, str(log)],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stderr + log.read_text()
    probe = json.loads(done.stdout)
    assert probe["tokens"] == 2
    # this side: the engine, its tokenizer and its row logic
    assert "ponder.engines.openvino" in probe["modules"]
    assert [m for m in probe["modules"] if _heavy(m)] == []
    # the engine process: its Python modules and the native libraries it mapped
    child = [
        line.split("|")[-1].strip()
        for line in log.read_text().splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    assert "openvino_genai" in child
    assert "ponder" not in child  # it imports nothing of ponder either
    assert [m for m in child if _heavy(m)] == []
    assert any("openvino" in lib for lib in probe["libraries"])
    assert [lib for lib in probe["libraries"] if "torch" in lib] == []
