"""The llama.cpp runner on the real SmolLM2-135M model (needs `make install-llama`)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest

from ponder.config import load_settings
from ponder.engines.llamacpp import (
    KVCacheFull,
    LlamaCppRunner,
    gguf_weights,
    select_llama_runner,
)
from ponder.engines.models import checkpoint_dir
from ponder.engines.runner import Prefill
from ponder.errors import ConfigError
from tests.engines import prompts

pytest.importorskip("llama_cpp", reason="the llama.cpp extra is not installed (make install-llama)")

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "smollm2-135m"
#: how far float16 weights, activations and KV let two orders of the same sums drift
#: (logits are ~[-20, 30]; one greedy flip needs a near tie)
F16_NOISE = 0.15
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    runner = LlamaCppRunner.load(load_settings(model=MODEL, torch_threads=1, llama_kv_tokens=4096))
    yield runner
    runner.close()


def chat(runner: LlamaCppRunner, prompt: str) -> list[int]:
    return prompts.chat(runner.tokenizer, prompt)


def run_rows(
    runner: LlamaCppRunner,
    prompts: list[list[int]],
    steps: int,
    leave: dict[int, int] | None = None,
    forced: list[list[int]] | None = None,
) -> tuple[list[list[int]], list[list[numpy.ndarray]]]:
    """Each row's tokens and the logits each was chosen from, all rows in one batch: the
    greedy picks, or each row fed its own ``forced`` tokens (teacher forcing); ``leave``:
    step -> row that leaves."""
    runner.keep([])
    prefixes = runner.prefill([Prefill(p) for p in prompts])
    for prefix in prefixes:
        runner.join(prefix)
    logits = [[p.logits] for p in prefixes]

    def pick(i: int) -> int:
        return forced[i][len(logits[i]) - 1] if forced else int(logits[i][-1].argmax())

    tokens = [[pick(i)] for i in range(len(prompts))]
    running = list(range(len(prompts)))
    for step in range(steps):
        out = runner.decode([tokens[i][-1] for i in running])
        assert out.shape == (len(running), out.shape[1]) and out.dtype == numpy.float32
        for i, row_logits in zip(running, out, strict=True):
            logits[i].append(row_logits)
            tokens[i].append(pick(i))
        if leave and step in leave:
            gone = running.index(leave[step])
            runner.keep([k for k in range(len(running)) if k != gone])
            running.pop(gone)
    runner.keep([])
    return tokens, logits


def greedy(
    runner: LlamaCppRunner,
    prompts: list[list[int]],
    steps: int,
    leave: dict[int, int] | None = None,
) -> list[list[int]]:
    """Greedy tokens of each prompt, all rows in one batch (``leave``: step -> row that leaves)."""
    return run_rows(runner, prompts, steps, leave)[0]


def test_rows_compute_the_same_alone_and_in_any_batch(runner: LlamaCppRunner) -> None:
    """llama.cpp multiplies one row with another kernel than a batch (batch_invariant is
    False): the logits agree to float16 rounding, and greedy picks agree but at near ties."""
    prompts = [chat(runner, p) for p in PROMPTS]
    runs = [run_rows(runner, [p], steps=10) for p in prompts]
    alone = [tokens[0] for tokens, _ in runs]
    alone_logits = [logits[0] for _, logits in runs]
    together = run_rows(runner, prompts, 10, leave={3: 0, 6: 2}, forced=alone)[1]
    reversed_batch = run_rows(runner, prompts[::-1], 10, forced=alone[::-1])[1][::-1]
    for i, tokens in enumerate(alone):
        for batch in (together, reversed_batch):
            for step, row_logits in enumerate(batch[i]):
                reference = alone_logits[i][step]
                assert float(numpy.abs(row_logits - reference).max()) < F16_NOISE
                top2 = numpy.sort(reference)[-2:]
                if top2[1] - top2[0] > 2 * F16_NOISE:
                    assert int(row_logits.argmax()) == tokens[step]
        assert len(together[i]) == {0: 5, 2: 8}.get(i, 11)
    # the answer to the first prompt names the capital
    assert "Paris" in runner.tokenizer.decode(alone[0])


def test_a_prefix_is_shared_by_rows_and_left_unchanged(runner: LlamaCppRunner) -> None:
    ids = chat(runner, PROMPTS[0])
    prefix = runner.prefill([Prefill(ids)])[0]
    logits = prefix.logits.copy()
    runner.join(prefix)
    runner.join(prefix)
    first = runner.decode([5, 5])
    assert numpy.allclose(first[0], first[1], atol=1e-4)
    runner.decode([6, 7])
    runner.keep([1])
    assert runner.rows == 1
    runner.keep([])
    # the rows' tokens went into their own sequences: the prefix still ends where it did
    again = runner.prefill([Prefill([5], prefix)])[0]
    assert again.length == prefix.length + 1
    # logits handed out are never written again: later calls leave them as they were
    assert numpy.array_equal(prefix.logits, logits)
    # a prefill pass and a decode step round through float16 differently
    assert float(numpy.abs(again.logits - first[0]).max()) < F16_NOISE
    prompts.check_bounds(runner, prefix)


def test_a_prompt_prefilled_in_chunks_matches_one_pass(runner: LlamaCppRunner) -> None:
    ids = runner.tokenizer(prompts.LONG_TEXT)["input_ids"]
    assert len(ids) > 600  # more than one llama_decode call of the runner
    whole = runner.prefill([Prefill(ids)])[0]
    for size in (37, 256):
        prefix = prompts.prefill_in_chunks(runner, ids, size)
        assert int(prefix.logits.argmax()) == int(whole.logits.argmax())
        assert float(numpy.abs(prefix.logits - whole.logits).max()) < 2 * F16_NOISE


def test_sequences_are_released_with_their_prefixes(runner: LlamaCppRunner) -> None:
    runner.keep([])
    gc.collect()
    runner.decode([])  # collects what was released
    free = len(runner._free)
    prefixes = runner.prefill([Prefill(chat(runner, p)) for p in PROMPTS])
    runner.join(prefixes[0])
    assert len(runner._free) == free - len(PROMPTS) - 1
    del prefixes
    runner.keep([0])  # the row keeps its own sequence
    runner.decode([1])
    assert len(runner._free) == free - 1
    runner.keep([])
    assert len(runner._free) == free


def test_a_full_kv_cache_fails_the_batch_and_the_runner_goes_on(runner: LlamaCppRunner) -> None:
    runner.keep([])
    long = [7] * 1000
    held = []
    with pytest.raises(KVCacheFull, match="PONDER_LLAMA_KV_TOKENS"):
        for _ in range(8):  # 4,096 positions hold four of these
            held.append(runner.prefill([Prefill(long)])[0])
    assert len(held) == 4
    del held
    ids = chat(runner, PROMPTS[0])
    assert "Paris" in runner.tokenizer.decode(greedy(runner, [ids], steps=10)[0])


def test_requantized_weights_are_made_once(tmp_path: Path) -> None:
    first = gguf_weights(MODEL, tmp_path, "q4_0", progress=lambda _: None)
    made = first.stat().st_mtime_ns
    assert first.parent == tmp_path and first.name.endswith(".q4_0.gguf")
    again = gguf_weights(MODEL, tmp_path, "q4_0", progress=lambda _: None)
    assert again == first and again.stat().st_mtime_ns == made
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    # a single-file packaged model is read where it lies
    assert gguf_weights(MODEL, tmp_path, "gguf").suffix == ".gguf"


def test_the_settings_choose_the_llama_runner(tmp_path: Path) -> None:
    assert select_llama_runner(load_settings(model_runner="native")) is None
    assert select_llama_runner(load_settings(model_runner="hf")) is None
    # auto leaves the native runner's int8 weights and checkpoint directories to torch
    assert select_llama_runner(load_settings(model_weights="int8")) is None
    (tmp_path / "config.json").write_text("{}")
    assert select_llama_runner(load_settings(model=str(tmp_path))) is None
    with pytest.raises(ConfigError, match="PONDER_LLAMA_WEIGHTS"):
        select_llama_runner(load_settings(model_runner="llama", model_weights="int8"))
    with pytest.raises(ConfigError, match="checkpoint directory"):
        select_llama_runner(load_settings(model_runner="llama", model=str(tmp_path)))
    chosen = select_llama_runner(load_settings(model_runner="auto", llama_kv_tokens=256))
    assert isinstance(chosen, LlamaCppRunner) and chosen.kv_tokens == 256
    chosen.close()


async def test_the_prompt_cache_never_takes_the_sequences_rows_need() -> None:
    """2 rows at once leave room for 2 cached prompts: 40 distinct prompts all run."""
    from ponder.engines.base import SampleRequest
    from ponder.engines.transformers import TransformersEngine

    engine = TransformersEngine(
        load_settings(model_runner="llama", engine_max_rows=2, torch_threads=1)
    )
    await engine.start()
    try:
        runner = engine._runner
        assert isinstance(runner, LlamaCppRunner) and runner.max_prefixes == 2
        requests = [
            SampleRequest(prompt=f"Say the number {i}.", max_new_tokens=2) for i in range(40)
        ]
        outputs = await asyncio.gather(*(engine.submit(r) for r in requests))
        assert all(o.completion_tokens >= 1 for o in outputs)
        assert len(engine._prefixes._entries) <= 2
    finally:
        await engine.close()
    with pytest.raises(ConfigError, match="PONDER_ENGINE_MAX_ROWS"):
        LlamaCppRunner.load(load_settings(engine_max_rows=240, llama_kv_tokens=256))


#: a process that runs the engine over llama.cpp, greedy and seeded, and never loads torch
_ENGINE_WITHOUT_TORCH = """
import asyncio, sys
from ponder.config import load_settings
from ponder.engines.base import SampleRequest
from ponder.engines.transformers import TransformersEngine

async def main():
    settings = load_settings(engine="transformers", model_runner="llama", torch_threads=1,
                             engine_max_rows=2, llama_kv_tokens=1024)
    engine = TransformersEngine(settings)
    try:
        outputs = await engine.generate([
            SampleRequest(prompt="What is the capital of France?", max_new_tokens=8),
            SampleRequest(prompt="Hi", temperature=1.0, top_p=0.9, seed=3, max_new_tokens=8),
        ])
    finally:
        await engine.close()
    print([o.text for o in outputs], "torch" in sys.modules)

asyncio.run(main())
"""


def test_the_engine_over_llama_cpp_never_imports_torch() -> None:
    # a first start converts the packaged model with torch: done here, not in the child
    checkpoint_dir(MODEL, load_settings().model_cache_dir)
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_WITHOUT_TORCH],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    texts, imported = done.stdout.strip().rsplit(" ", 1)
    assert "Paris" in texts
    assert imported == "False"
