"""Benchmark: ponder's engine (OpenVINO GenAI under ponder's scheduler) against the bare
pipeline, llama.cpp and CTranslate2, and through the service (issue 24).

Run with ``make bench-engine`` (``.venv/bin/python bench/engine.py``) after ``make peers``.
Writes ``bench/results/engine.md``, ``engine.png`` and ``engine.json`` (this run's figures;
the next run prints them beside its own). ``--agreement`` instead checks what each
engine's weights change in the answers and writes
``bench/results/engine-agreement-<style>.md``.

For each model (SmolLM2-135M, Qwen2.5-Coder-0.5B), each leg runs in a process of its own
(its peak RSS is that process's VmHWM, plus its children's where it has an engine
process), at ``--threads`` threads (1: on a small shared machine two threads slow down
many-fold whenever another process takes a core). Legs (``--only`` takes their labels):

- ``ponder``: :class:`~ponder.engines.openvino.OpenVINOEngine` through its ``submit`` API,
  every row submitted at once, on the configured weights (``PONDER_ENGINE_WEIGHTS``; the
  default f16: the answers of the float32 model), ``PONDER_ENGINE_MAX_ROWS`` 32 (at
  least), its KV cache (``PONDER_ENGINE_KV_TOKENS``) the positions the largest run needs,
  each row rounded up to the pipeline's 32-position blocks (llama.cpp's context gets as
  many), the prefix cache on (the default). The pipeline runs in the engine's child
  process: the peak RSS is the worker's VmHWM plus the engine process's (read before the
  engine closes);
- ``openvino bare``: ``openvino_genai.ContinuousBatchingPipeline`` used directly, on the
  same ``model.gguf`` of ponder's cache, with the scheduler configuration the engine gives
  its process (f32 inference and KV cache, ``INFERENCE_NUM_THREADS``, ``num_kv_blocks`` =
  the same KV positions / 32, ``max_num_seqs``, ``max_num_batched_tokens``, dynamic
  split-fuse, the prefix cache, greedy, the chosen token's logprob): the token ids as
  ponder templates them, every row added at once, ``step()`` until none is left;
- ``llama.cpp <quant>``: llama-cpp-python's low-level batched API (``llama_batch`` +
  ``llama_decode``, one sequence id per row, rows leave as they end: continuous batching
  over a fixed set), on the packaged GGUF file (SmolLM2 Q4_1, Qwen Q4_K_M) and on the same
  weights requantized to Q4_0, Q8_0 (the quantizations with a repacked fast path) and
  F16; its context as many positions as ponder's KV cache;
- ``ct2 int8`` / ``ct2 float32``: CTranslate2, converted from ponder's float32 checkpoint;
  ``generate_batch`` runs each batch whole (static batching);
- ``numpy sgemm``: the one-core f32 limit: a 2048 x 2048 float32 matrix product at one
  BLAS thread (``OPENBLAS_NUM_THREADS=1``), best of 5, in GFLOP/s;
- ``service``: ``ponder serve`` on the openvino engine measured through HTTP
  (``bench/engine_service.py``: 16 concurrent fast tasks; a 16-token answer beside a
  600-token essay; ``/healthz`` latency while 32 rows decode).

The goals compare each engine on the weights that keep its answers (``KEEPS_ANSWERS``:
agreement with the float32 model in the agreement reports) and show the fastest leg of
all beside. Every engine leg gets the same token ids (ponder's chat template), greedy
decoding and ``--new-tokens`` new tokens per row at most (rows stop at end of sequence:
the tables show the tokens produced). Sections:

1. Throughput: completion tokens/s (prefill included) at 1, 4, 8, 16, 32 rows; peak RSS.
2. Prefill: prompt tokens/s for one ~480-token prompt and for 32 short prompts (ponder and
   the bare pipeline: each row asks for one new token; the peers: one forward pass).
3. Shared prefix (ponder): the wall time of N = 1, 3, 5, 8 seeded samples of one
   ~480-token prompt submitted at once.
4. The one-core f32 limit: tokens/s limit = sgemm GFLOP/s / (2 x the parameters every
   token is multiplied through: the blocks' linear layers and the output projection, not
   the embedding lookup, nor attention over the context); each engine's fraction of it.
5. The service (above), against the bare pipeline's tokens/s at 16 rows.
6. The goals of issue 24, each with its measured ratio and verdict, and where one is
   missed, why, from the figures.

Prefix cache: each repeat runs every leg in a fresh process (a fresh engine, an empty
cache), and within a process every prompt is distinct in its first 32 tokens (a tag at
the start of the user's text; the pipeline caches whole 32-position blocks), so no
measurement reuses an earlier one's prefill; only the N samples of the shared-prefix
section share their prompt, by design. The legs are interleaved: each of ``--repeats``
rounds runs every leg once, so a change of the machine's load falls on all of them; each
cell is the best of its rounds (other work on the machine only ever slows a run down;
peak RSS: the highest); the 1-minute load average is recorded at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_service import service_worker, vm_hwm_gb

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct", "qwen0.5b": "Qwen2.5-Coder-0.5B-Instruct"}
ROWS = (1, 4, 8, 16, 32)
SAMPLES = (1, 3, 5, 8)
#: the pipeline's KV block on the CPU, in positions (ponder.engines.openvino._BLOCK)
BLOCK = 32
#: the rows ponder's engine and the bare pipeline take at least (32 short prompts prefill)
MIN_MAX_ROWS = 32
#: the one-core f32 limit's matrix size and runs
SGEMM_N, SGEMM_RUNS = 2048, 5
#: the issue's goals
GOAL_ONE_ROW = 0.7  # x llama.cpp's single sequence
GOAL_BATCHED = 1.8  # x llama.cpp's batched decode, at 16 and 32 rows
GOAL_CT2 = 1.0  # x CTranslate2 int8, at 16 and 32 rows
GOAL_RSS = 1.5  # x llama.cpp's peak RSS at the same rows and context
GOAL_SERVICE = 0.8  # x the bare pipeline's tokens/s at 16 rows
GOAL_BESIDE = 2.0  # x the 16-token answer's time alone
GOAL_HEALTHZ_MS = 20.0  # p99 of /healthz while 32 rows decode
#: the peer legs measured to keep the float32 model's greedy answers (agreement with the
#: float32 transformers model: bench/results/engine-agreement-short.md and -quality.md,
#: measured through ponder's former llama.cpp runner, the same library as these legs):
#: the goals compare ponder with the fastest of them, and show the fastest leg of all
KEEPS_ANSWERS: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "llama.cpp F16": "46-48/50 short answers, 296/300 quality problems",
        "ct2 float32": "50/50 short answers",
    },
    "qwen0.5b": {
        "llama.cpp F16": "49/50 short answers, 98/100 quality problems",
        "llama.cpp Q8_0": "48/50 short answers, 91/100 quality problems",
        "ct2 float32": "50/50 short answers",
    },
}
#: ... and those measured to change them
CHANGES_ANSWERS: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "llama.cpp Q8_0": "27-29/50 short answers",
        "llama.cpp Q4_0": "10/50 short answers",
        "ct2 int8": "8/50 short answers, 93/300 quality problems",
    },
    "qwen0.5b": {
        "llama.cpp Q4_0": "24/50 short answers",
        "ct2 int8": "42/50 short answers",
    },
}
#: the issue's figures (one run, load ~2), shown as the previous run before any run of
#: this script: tokens/s by rows, peak RSS GB
ISSUE_FIGURES: dict[str, Any] = {
    "source": "issue 24 (its own measurement; prompts and load differ from this run's)",
    "smollm2-135m": {
        "openvino bare": {"rate": {"1": 21.4, "8": 119.9, "16": 190.2, "32": 260.9},
                          "rss_gb": 1.52},
        "llama.cpp Q4_1": {"rate": {"1": 46.0}, "rss_gb": 0.21},
        "llama.cpp F16": {"rate": {"1": 31.1}, "rss_gb": 0.37},
    },
    "qwen0.5b": {
        "openvino bare": {"rate": {"1": 12.3, "8": 91.9, "16": 130.8, "32": 162.3},
                          "rss_gb": 2.09},
        "llama.cpp Q8_0": {"rate": {"1": 14.5}, "rss_gb": 0.77},
        "ct2 int8": {"rate": {"1": 23.9, "8": 88.0, "16": 110.2, "32": 116.4}, "rss_gb": 4.15},
    },
}  # fmt: skip

SUBJECTS = [
    "a brave dragon", "a lost robot", "a lighthouse keeper", "a talking cat", "a desert city",
    "a clockmaker", "a deep-sea diver", "a mountain village", "a young wizard", "an old pirate",
    "a space station", "a haunted library", "a river otter", "a baker at dawn", "a chess prodigy",
    "a storm at sea", "a forgotten king", "a firefly", "a circus acrobat", "an arctic fox",
    "a secret garden", "a train conductor", "a volcano", "a paper boat", "a night market",
    "a glass bridge", "a sleepy giant", "a painter", "a snow leopard", "a music box",
    "a desert nomad", "a comet",
]  # fmt: skip
PROMPTS = [
    f"Write a long, detailed story about {s}. Describe the place, the weather, the sounds "
    "and the people around, and end with a surprise."
    for s in SUBJECTS
]

FEW_SHOT = """Solve each problem step by step, then give the answer on its own line.

Problem: A farmer has 12 cows and buys 7 more. Then 4 cows are sold. How many cows remain?
Solution: The farmer starts with 12 cows. After buying 7 he has 12 + 7 = 19 cows. After
selling 4 he has 19 - 4 = 15 cows.
Answer: 15

Problem: A box holds 6 rows of 8 eggs. 5 eggs break. How many eggs are left?
Solution: The box holds 6 x 8 = 48 eggs. After 5 break, 48 - 5 = 43 eggs are left.
Answer: 43

Problem: Tom reads 25 pages a day for 4 days and then 30 pages on the fifth day. How many
pages did he read?
Solution: In four days he reads 25 x 4 = 100 pages. With the fifth day, 100 + 30 = 130.
Answer: 130

Problem: A shop sells pens at 3 dollars each. Ann buys 9 pens and pays with a 50 dollar
note. How much change does she get?
Solution: The pens cost 9 x 3 = 27 dollars. Her change is 50 - 27 = 23 dollars.
Answer: 23

Problem: A train travels 60 kilometres an hour for 3 hours, then 45 kilometres an hour for
2 hours. How far does it travel in all?
Solution: First 60 x 3 = 180 km, then 45 x 2 = 90 km, so 180 + 90 = 270 km.
Answer: 270

Problem: A class of 28 pupils splits into teams of 4. Each team gets 3 balls. How many
balls are needed?
Solution:"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def tagged(tag: str, text: str) -> str:
    """``text`` made distinct by a tag at its start: the templated prompt's first KV block
    (32 positions, more than the chat template's head) differs from every other prompt's,
    so no prompt reuses another's cached prefill."""
    return f"[{tag}] {text}"


def prompt_texts(rows: list[int]) -> dict[str, Any]:
    """Every prompt a leg runs, each distinct (the shared-prefix samples share theirs)."""
    return {
        "warmup": tagged("warm-up", PROMPTS[-1]),
        "rows": {
            str(r): [tagged(f"{r}.{i}", PROMPTS[i % len(PROMPTS)]) for i in range(r)] for r in rows
        },
        "long": tagged("prefill", FEW_SHOT),
        "short": [tagged(f"prefill {i}", p) for i, p in enumerate(PROMPTS)],
        "shared": {str(n): tagged(f"shared {n}", FEW_SHOT) for n in SAMPLES},
    }


def peak_rss_gb() -> float:
    """This process's peak resident memory since it started (VmHWM).

    Not ``getrusage``'s ``ru_maxrss``: Linux carries the forked parent's high-water mark
    across ``exec`` into it, so a worker started by a big orchestrator reported the
    orchestrator's peak.
    """
    return vm_hwm_gb(os.getpid())


def rss_gb(pid: int | None = None) -> float:
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 2**20


def timed(run: Callable[[], int]) -> dict[str, float]:
    """One call of ``run() -> tokens``: its wall time and tokens."""
    started = time.perf_counter()
    tokens = run()
    return {"seconds": time.perf_counter() - started, "tokens": tokens}


# --- workers (each in its own process) ----------------------------------------------------


def ponder_worker(job: dict[str, Any]) -> dict[str, Any]:
    """ponder's engine through its submit API: throughput, prefill, shared prefix (.venv)."""
    import_rss = rss_gb()
    from ponder.config import load_settings
    from ponder.engines.base import SampleRequest
    from ponder.engines.openvino import OpenVINOEngine

    settings = load_settings(
        engine="openvino",
        model=job["model"],
        engine_threads=job["threads"],
        engine_max_rows=job["max_rows"],
        engine_kv_tokens=job["kv_tokens"],
    )
    engine = OpenVINOEngine(settings)
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    loop.run_until_complete(engine.start())
    load_s = time.perf_counter() - started
    pid = engine.process_pid
    assert pid is not None
    loaded_rss = (rss_gb(), rss_gb(pid))

    def submit(requests: list[SampleRequest]) -> list[Any]:
        async def all_of() -> list[Any]:
            return await asyncio.gather(*(engine.submit(r) for r in requests))

        return loop.run_until_complete(all_of())

    def completion(requests: list[SampleRequest]) -> int:
        return sum(out.completion_tokens for out in submit(requests))

    def prefill(requests: list[SampleRequest]) -> int:
        return sum(out.prompt_tokens for out in submit(requests))

    n, texts, label = job["new_tokens"], job["texts"], job["label"]
    submit([SampleRequest(prompt=texts["warmup"], max_new_tokens=4)])
    result: dict[str, Any] = {"rows": {}, "load_s": load_s, "weights": engine.weights}
    for rows in job["rows"]:
        requests = [SampleRequest(prompt=p, max_new_tokens=n) for p in texts["rows"][str(rows)]]
        cell = result["rows"][str(rows)] = timed(lambda r=requests: completion(r))
        log(f"  {label} {rows:2d} rows: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    for name, requests in (
        ("long", [SampleRequest(prompt=texts["long"], max_new_tokens=1)]),
        ("short", [SampleRequest(prompt=p, max_new_tokens=1) for p in texts["short"]]),
    ):
        cell = result[f"prefill_{name}"] = timed(lambda r=requests: prefill(r))
        log(f"  {label} prefill {name}: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    shared = result["shared"] = {}
    for count in SAMPLES:
        prompt = texts["shared"][str(count)]
        requests = [
            SampleRequest(prompt=prompt, temperature=0.7, seed=i, max_new_tokens=n)
            for i in range(count)
        ]
        cell = shared[str(count)] = timed(lambda r=requests: completion(r))
        log(f"  {label} {count} samples of one prompt: {cell['seconds']:.2f} s")
    engine_peak = vm_hwm_gb(pid)  # before close(): the engine process ends there
    loop.run_until_complete(engine.close())
    loop.close()
    parent_peak = peak_rss_gb()
    result.update(
        peak_rss_gb=parent_peak + engine_peak,
        parent_peak_rss_gb=parent_peak,
        engine_peak_rss_gb=engine_peak,
        import_rss_gb=import_rss,
        loaded_rss_gb=loaded_rss[0],
        engine_loaded_rss_gb=loaded_rss[1],
        torch_loaded="torch" in sys.modules,
        weights_gb=Path(job["ov_path"]).stat().st_size / 1e9,
    )
    return result


def openvino_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The bare pipeline on ponder's cache file, configured as the engine configures its
    process (ponder.engines.openvino_process), driven by add_request + step (.venv)."""
    import numpy
    import openvino
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 0
    scheduler.num_kv_blocks = math.ceil(job["kv_tokens"] / BLOCK)
    scheduler.max_num_seqs = job["max_rows"]
    scheduler.max_num_batched_tokens = max(job["step_tokens"], job["max_rows"])
    scheduler.dynamic_split_fuse = True
    scheduler.enable_prefix_caching = True
    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    if job["threads"] > 0:
        properties["INFERENCE_NUM_THREADS"] = job["threads"]
    started = time.perf_counter()
    pipe = genai.ContinuousBatchingPipeline(job["ov_path"], scheduler, "CPU", properties)
    load_s = time.perf_counter() - started
    next_id = 0

    def generate(rows: list[list[int]], new_tokens: int) -> int:
        """Every row added at once, steps until none is left: the tokens generated."""
        nonlocal next_id
        config = genai.GenerationConfig()
        config.max_new_tokens = new_tokens
        config.stop_token_ids = set(job["eos_ids"])
        config.logprobs = 1  # as the engine asks
        handles = []
        for ids in rows:
            tensor = openvino.Tensor(numpy.asarray([ids], dtype=numpy.int64))
            handles.append(pipe.add_request(next_id, tensor, config))
            next_id += 1
        produced = 0
        while pipe.has_non_finished_requests():
            pipe.step()
            for handle in handles:
                if handle.can_read():
                    for output in handle.read().values():
                        produced += len(output.generated_ids)
        for handle in handles:  # the last step's tokens
            if handle.can_read():
                for output in handle.read().values():
                    produced += len(output.generated_ids)
        return produced

    n, ids, label = job["new_tokens"], job["ids"], job["label"]
    generate([ids["warmup"]], 4)
    result: dict[str, Any] = {"rows": {}, "load_s": load_s, "weights": job["weights"]}
    for rows in job["rows"]:
        cell = result["rows"][str(rows)] = timed(lambda r=ids["rows"][str(rows)]: generate(r, n))
        log(f"  {label} {rows:2d} rows: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    for name, prompts in (("long", [ids["long"]]), ("short", ids["short"])):
        cell = result[f"prefill_{name}"] = timed(
            lambda p=prompts: (generate(p, 1), sum(len(x) for x in p))[1]
        )
        log(f"  {label} prefill {name}: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    result.update(peak_rss_gb=peak_rss_gb(), weights_gb=Path(job["ov_path"]).stat().st_size / 1e9)
    return result


def llama_worker(job: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's low-level batched API (runs in .venv-peers)."""
    import ctypes

    import llama_cpp as lc
    import numpy as np

    lc.llama_backend_init()
    path = job["gguf"]
    if job.get("requantize"):
        path = str(Path(job["workdir"]) / f"{Path(job['gguf']).stem}.{job['requantize']}.gguf")
        if not Path(path).is_file():
            params = lc.llama_model_quantize_default_params()
            params.ftype = {"Q4_0": 2, "Q8_0": 7, "F16": 1}[job["requantize"]]
            params.allow_requantize = True
            params.nthread = job["threads"]
            rc = lc.llama_model_quantize(job["gguf"].encode(), path.encode(), ctypes.byref(params))
            if rc != 0:
                raise RuntimeError(f"llama_model_quantize returned {rc}")
    model = lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    ids = job["ids"]
    n_batch = 512

    def context(seqs: int, positions: int) -> Any:
        params = lc.llama_context_default_params()
        params.n_ctx = positions
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = seqs
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = job["threads"]
        params.no_perf = True
        return lc.llama_init_from_model(model, params)

    batch = lc.llama_batch_init(n_batch, 0, 1)

    def decode(ctx: Any, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """Decode (token, position, sequence, wants logits) entries; the greedy picks."""
        picks = []
        for first in range(0, len(entries), n_batch):
            chunk = entries[first : first + n_batch]
            for i, (token, pos, seq, wants) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, wants
            batch.n_tokens = len(chunk)
            if lc.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i, (*_, wants) in enumerate(chunk):
                if wants:
                    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), (n_vocab,))
                    picks.append(int(logits.argmax()))
        return picks

    def prefill_entries(rows: list[list[int]]) -> list[tuple[int, int, int, bool]]:
        return [
            (t, p, seq, p == len(prompt) - 1)
            for seq, prompt in enumerate(rows)
            for p, t in enumerate(prompt)
        ]

    def generate(ctx: Any, rows: list[list[int]]) -> int:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        last = decode(ctx, prefill_entries(rows))
        produced = [1] * len(rows)
        lengths = [len(prompt) for prompt in rows]
        active = [s for s in range(len(rows)) if not lc.llama_vocab_is_eog(vocab, last[s])]
        while active:
            active = [s for s in active if produced[s] < job["new_tokens"]]
            if not active:
                break
            picks = decode(ctx, [(last[s], lengths[s], s, True) for s in active])
            for s, token in zip(active, picks, strict=True):
                lengths[s] += 1
                produced[s] += 1
                last[s] = token
            # a row that ends leaves the batch at once (continuous batching)
            active = [s for s in active if not lc.llama_vocab_is_eog(vocab, last[s])]
        return sum(produced)

    result: dict[str, Any] = {"rows": {}, "weights": job.get("requantize") or job["quant"]}
    for rows in job["rows"]:
        chosen = ids["rows"][str(rows)]
        need = sum(len(p) for p in chosen) + rows * job["new_tokens"]
        # the context as many positions as ponder's KV cache (more where a run needs more)
        ctx = context(rows, max(job["kv_tokens"], need + 64))
        generate(ctx, [ids["warmup"]])  # warm-up
        cell = result["rows"][str(rows)] = timed(lambda c=ctx, r=chosen: generate(c, r))
        log(f"  {job['label']} {rows:2d} rows: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
        lc.llama_free(ctx)
    for name, rows in (("long", [ids["long"]]), ("short", ids["short"])):
        ctx = context(len(rows), sum(len(r) for r in rows) + 64)

        def prefill(c: Any = ctx, r: list[list[int]] = rows) -> int:
            lc.llama_memory_clear(lc.llama_get_memory(c), True)
            decode(c, prefill_entries(r))
            return sum(len(x) for x in r)

        cell = result[f"prefill_{name}"] = timed(prefill)
        log(f"  {job['label']} prefill {name}: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
        lc.llama_free(ctx)
    result.update(peak_rss_gb=peak_rss_gb(), weights_gb=Path(path).stat().st_size / 1e9)
    return result


def ct2_generator(job: dict[str, Any]) -> tuple[Any, Any]:
    """CTranslate2's generator of ``job["checkpoint"]`` in ``job["compute_type"]`` (int8 by
    default; converted once) and its tokenizer."""
    generator, tokenizer, _ = _ct2_model(job)
    return generator, tokenizer


def _ct2_model(job: dict[str, Any]) -> tuple[Any, Any, Path]:
    import ctranslate2
    from transformers import AutoTokenizer

    compute = job.get("compute_type", "int8")
    suffix = "" if compute == "int8" else f"-{compute}"
    out = Path(job["workdir"]) / f"ct2-{Path(job['checkpoint']).name}{suffix}"
    if not (out / "model.bin").is_file():
        converter = ctranslate2.converters.TransformersConverter(job["checkpoint"])
        converter.convert(str(out), quantization=compute, force=True)
    tokenizer = AutoTokenizer.from_pretrained(job["checkpoint"], local_files_only=True)
    generator = ctranslate2.Generator(
        str(out), device="cpu", compute_type=compute, intra_threads=job["threads"]
    )
    return generator, tokenizer, out / "model.bin"


def ct2_worker(job: dict[str, Any]) -> dict[str, Any]:
    """CTranslate2, static batches (runs in .venv-peers)."""
    generator, tokenizer, weights = _ct2_model(job)
    ids = job["ids"]

    def tokens(prompts: list[list[int]]) -> list[list[str]]:
        return [tokenizer.convert_ids_to_tokens(p) for p in prompts]

    def generate(rows: list[list[str]]) -> int:
        results = generator.generate_batch(
            rows,
            max_length=job["new_tokens"],
            sampling_topk=1,
            include_prompt_in_result=False,
        )
        return sum(len(r.sequences_ids[0]) for r in results)

    result: dict[str, Any] = {"rows": {}, "weights": job.get("compute_type", "int8")}
    generate(tokens([ids["warmup"]]))  # warm-up
    for rows in job["rows"]:
        chosen = tokens(ids["rows"][str(rows)])
        cell = result["rows"][str(rows)] = timed(lambda r=chosen: generate(r))
        log(f"  {job['label']} {rows:2d} rows: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    for name, prompts in (("long", tokens([ids["long"]])), ("short", tokens(ids["short"]))):
        cell = result[f"prefill_{name}"] = timed(
            lambda r=prompts: (generator.forward_batch(r), sum(len(x) for x in r))[1]
        )
        log(f"  {job['label']} prefill {name}: {cell['tokens'] / cell['seconds']:6.1f} tok/s")
    result.update(peak_rss_gb=peak_rss_gb(), weights_gb=weights.stat().st_size / 1e9)
    return result


def ct2_answers_worker(job: dict[str, Any]) -> dict[str, Any]:
    """CTranslate2's greedy texts of templated prompts (``--agreement``; .venv-peers)."""
    generator, tokenizer = ct2_generator(job)
    end = [tokenizer.convert_ids_to_tokens(i) for i in job["eos_ids"]]
    texts: list[str] = []
    for first in range(0, len(job["prompts"]), 16):
        rows = [tokenizer.convert_ids_to_tokens(ids) for ids in job["prompts"][first : first + 16]]
        results = generator.generate_batch(
            rows,
            max_length=job["new_tokens"],
            sampling_topk=1,
            end_token=end,
            include_prompt_in_result=False,
        )
        texts += [tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True) for r in results]
    return {"texts": texts}


def sgemm_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The one-core f32 limit: a square float32 matrix product, one BLAS thread (.venv;
    run_worker sets OPENBLAS_NUM_THREADS=1 before numpy loads)."""
    import numpy

    n = job["n"]
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=numpy.float32)
    b = rng.standard_normal((n, n), dtype=numpy.float32)
    out = numpy.empty((n, n), dtype=numpy.float32)
    numpy.matmul(a, b, out=out)  # warm-up
    best, wall, cpu = math.inf, 0.0, 0.0
    for _ in range(job["runs"]):
        started, cpu_started = time.perf_counter(), time.process_time()
        numpy.matmul(a, b, out=out)
        seconds = time.perf_counter() - started
        best, wall, cpu = (
            min(best, seconds),
            wall + seconds,
            cpu + time.process_time() - cpu_started,
        )
    gflops = 2 * n**3 / best / 1e9
    log(f"  {job['label']}: {gflops:.1f} GFLOP/s (n={n}, CPU time / wall {cpu / wall:.2f})")
    return {"gflops": gflops, "n": n, "cpu_per_wall": cpu / wall, "peak_rss_gb": peak_rss_gb()}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ponder": ponder_worker,
    "openvino": openvino_worker,
    "llama": llama_worker,
    "ct2": ct2_worker,
    "ct2-answers": ct2_answers_worker,
    "sgemm": sgemm_worker,
    "service": service_worker,
}
#: the workers that run in .venv (the others in .venv-peers)
OWN_VENV = frozenset({"ponder", "openvino", "sgemm", "service"})
#: one BLAS / OpenMP thread (the sgemm worker's environment)
ONE_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def run_worker(python: Path, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run one worker in its own process; {"error": why} when it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **job.get("env", {})}
    try:
        proc = subprocess.run(
            [str(python), __file__, "--worker", job["worker"]],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    sys.stderr.write("".join(line + "\n" for line in proc.stderr.splitlines() if "  " in line[:2]))
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])[-400:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- orchestration ------------------------------------------------------------------------


def prepare(model: str, workdir: Path, rows: list[int], checkpoint: bool) -> dict[str, Any]:
    """For ``model``: ponder's cache entry (written once) and what the legs share: the
    prompts as text and as token ids (ponder's tokenizer and chat template), the end ids,
    the packaged GGUF file, the parameters a token is multiplied through, and (when a
    CTranslate2 leg runs: ``checkpoint``) the float32 checkpoint."""
    import gguf

    from ponder.config import load_settings
    from ponder.engines.base import SampleRequest
    from ponder.engines.models import PACKAGED_MODELS, assemble_gguf, checkpoint_dir, engine_files
    from ponder.engines.openvino import _model_facts
    from ponder.engines.textrows import encode_prompt
    from ponder.engines.tokenizer import ChatTokenizer

    settings = load_settings(model=model)
    weights = settings.engine_weights
    files = engine_files(model, settings.model_cache_dir, weights)
    tokenizer = ChatTokenizer(files)

    def encode(text: str) -> list[int]:
        return encode_prompt(tokenizer, SampleRequest(prompt=text))

    texts = prompt_texts(rows)
    ids = {
        "warmup": encode(texts["warmup"]),
        "rows": {r: [encode(t) for t in ts] for r, ts in texts["rows"].items()},
        "long": encode(texts["long"]),
        "short": [encode(t) for t in texts["short"]],
        "shared": {n: encode(t) for n, t in texts["shared"].items()},
    }
    _, eos = _model_facts(files / "model.gguf")
    if tokenizer.eos_token_id is not None:
        eos |= {tokenizer.eos_token_id}
    packaged = PACKAGED_MODELS[model]
    reader = gguf.GGUFReader(files / "model.gguf")
    matrices = {t.name: int(t.n_elements) for t in reader.tensors if len(t.shape) == 2}
    embedding = matrices.pop("token_embd.weight", 0)
    # the output projection: its own matrix, or the embedding's (tied) multiplied through
    matmul_params = sum(matrices.values()) + (0 if "output.weight" in matrices else embedding)
    fields = reader.fields
    arch = fields["general.architecture"].contents()

    def field(name: str, default: int = 0) -> int:
        value = fields.get(f"{arch}.{name}")
        return int(value.contents()) if value is not None else default

    head = field("embedding_length") // field("attention.head_count", 1)
    per_position = (  # keys and values of every layer, one number each
        field("block_count")
        * field("attention.head_count_kv", field("attention.head_count"))
        * (field("attention.key_length", head) + field("attention.value_length", head))
    )
    return {
        "weights": weights,
        "ov_path": str(files / "model.gguf"),
        "checkpoint": str(checkpoint_dir(model, settings.model_cache_dir)) if checkpoint else "",
        "gguf": str(assemble_gguf(packaged.locate(), packaged.sha256, workdir / f"{model}.gguf")),
        "texts": texts,
        "ids": ids,
        "eos_ids": sorted(eos),
        "step_tokens": settings.engine_step_tokens,
        "matmul_params": matmul_params,
        "total_params": sum(int(t.n_elements) for t in reader.tensors),
        "common_start": common_start(ids),
        "kv_numbers_per_position": per_position,
    }


def common_start(ids: dict[str, Any]) -> int:
    """The most leading tokens two of the prompts share (the shared-prefix section's own
    samples aside); below BLOCK: no prompt can reuse another's cached block."""
    prompts = [ids["warmup"], ids["long"], *ids["short"], *ids["shared"].values()]
    for rows in ids["rows"].values():
        prompts += rows
    most = 0
    ordered = sorted(prompts)
    for a, b in itertools.pairwise(ordered):
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        most = max(most, min(len(a), len(b)) if same is None else same)
    return most


def engines_for(gguf: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, worker, extra job fields) of every leg measured on a model."""
    # the packaged file's quantization is the last part of its name (SmolLM2's:
    # "...Instruct.Q4_1"); Qwen's parts are assembled into "<model>.gguf", a Q4_K_M file
    last = Path(gguf).stem.split(".")[-1]
    packaged = last if re.fullmatch(r"I?Q\d\w*|F16|BF16|F32", last) else "Q4_K_M"
    return [
        ("ponder", "ponder", {}),
        ("openvino bare", "openvino", {}),
        (f"llama.cpp {packaged}", "llama", {"quant": packaged}),
        ("llama.cpp Q4_0", "llama", {"requantize": "Q4_0"}),
        ("llama.cpp Q8_0", "llama", {"requantize": "Q8_0"}),
        ("llama.cpp F16", "llama", {"requantize": "F16"}),
        ("ct2 int8", "ct2", {}),
        # CTranslate2 at the precision that keeps the answers (the agreement run's control)
        ("ct2 float32", "ct2", {"compute_type": "float32"}),
        ("numpy sgemm", "sgemm", {"n": SGEMM_N, "runs": SGEMM_RUNS, "env": ONE_THREAD}),
        ("service", "service", {"stories": PROMPTS}),
    ]


def kv_tokens(data: dict[str, Any], args: argparse.Namespace) -> int:
    """KV positions for ponder's engine, the bare pipeline and llama.cpp's largest context:
    what the largest run needs, each row rounded up to the pipeline's 32-position blocks
    (the shared-prefix samples counted as if they shared nothing)."""
    ids = data["ids"]

    def need(lengths: list[int], new: int) -> int:
        return sum(math.ceil((n + new) / BLOCK) * BLOCK for n in lengths)

    return max(
        need([len(p) for p in ids["rows"][str(max(args.rows))]], args.new_tokens),
        need([len(ids["shared"][str(max(SAMPLES))])] * max(SAMPLES), args.new_tokens),
        need([len(p) for p in ids["short"]], 1),
        need([len(ids["long"])], 1),
    )


def best_cells(kept: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """One leg's figures over repeats: each timed cell's fastest (latencies: the lowest
    p99; sgemm: the highest rate), the memory figures of the repeat with the highest peak
    RSS."""
    if kept is None or "error" in new:
        return new

    def merge(a: Any, b: Any) -> Any:
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return b
        if "p99_ms" in a and "p99_ms" in b:
            return a if a["p99_ms"] <= b["p99_ms"] else b
        if "seconds" in a and "seconds" in b:
            return a if a["seconds"] <= b["seconds"] else b
        if "gflops" in a and "gflops" in b:
            return a if a["gflops"] >= b["gflops"] else b
        merged = {k: merge(a[k], v) if k in a else v for k, v in b.items()}
        if "peak_rss_gb" in a and "peak_rss_gb" in b:
            source = a if a["peak_rss_gb"] >= b["peak_rss_gb"] else b
            merged.update({k: v for k, v in source.items() if k.endswith("rss_gb")})
        return merged

    merged: dict[str, Any] = merge(kept, new)
    return merged


def main_run(args: argparse.Namespace) -> None:
    """Run the legs on each of ``args.models``; write the report of every model measured.

    Each model's figures are one run of their own (its ratios never mix runs); with
    ``--merge`` the other models' figures of ``engine.json`` are kept beside them, else
    ``engine.json`` becomes the previous figures shown in brackets.
    """
    path = RESULTS / "engine.json"
    stored: dict[str, Any] | None = json.loads(path.read_text()) if path.is_file() else None
    if args.merge and stored is not None:
        figures = stored
        for model in MODELS:  # a model measured by the former legs has other figures
            if model in figures and "matmul_params" not in figures[model]:
                log(f"--merge: dropping {model}'s figures of a former version of this script")
                del figures[model]
    else:
        previous = dict(stored or ISSUE_FIGURES)
        previous.pop("previous", None)
        if "source" not in previous:
            previous["source"] = "the previous run of this script: " + ", ".join(
                f"{MODELS[m]} {previous[m]['run']['date']}" for m in MODELS if m in previous
            )
        figures = {"previous": previous}
    command = shlex.join([".venv/bin/python", "bench/engine.py", *sys.argv[1:]]) + (
        "" if sys.argv[1:] else " (= make bench-engine)"
    )
    text = ""
    with tempfile.TemporaryDirectory(prefix="ponder-bench-engine-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for model in args.models:
            log(f"{model} ...")
            started, load_before = time.monotonic(), os.getloadavg()[0]
            legs = [
                (label, worker, extra)
                for label, worker, extra in engines_for(prepare_gguf(model, workdir))
                if not args.only
                or any(
                    label == o or (o.endswith("*") and label.startswith(o[:-1])) for o in args.only
                )
            ]
            checkpoint = any(worker == "ct2" for _, worker, _ in legs)
            data = prepare(model, workdir, list(args.rows), checkpoint)
            kv = kv_tokens(data, args)
            max_rows = max([*args.rows, max(SAMPLES), MIN_MAX_ROWS])
            measured: dict[str, Any] = {}
            # interleaved: each repeat runs every leg once (a change of the machine's load
            # falls on all of them), and each cell keeps its best repeat
            for repeat in range(args.repeats):
                log(f"{model}: repeat {repeat + 1} of {args.repeats}")
                for label, worker, extra in legs:
                    if "error" in measured.get(label, {}):
                        continue
                    python = Path(sys.executable) if worker in OWN_VENV else PEERS_PYTHON
                    if not python.is_file():
                        measured[label] = {"error": f"{python} is missing: run `make peers`"}
                        continue
                    job = {
                        "worker": worker,
                        "label": label,
                        "model": model,
                        "rows": list(args.rows),
                        "new_tokens": args.new_tokens,
                        "threads": args.threads,
                        "workdir": str(workdir),
                        "kv_tokens": kv,
                        "max_rows": max_rows,
                        **{k: data[k] for k in ("checkpoint", "gguf", "ov_path", "weights")},
                        **{k: data[k] for k in ("ids", "texts", "eos_ids", "step_tokens")},
                        **extra,
                    }
                    result = run_worker(python, job, args.timeout_s)
                    measured[label] = best_cells(measured.get(label), result)
                    if "error" in result:
                        log(f"  {label}: {result['error']}")
            ids = data["ids"]
            figures[model] = {
                "run": {
                    "command": command,
                    "date": dt.date.today().isoformat(),
                    "minutes": (time.monotonic() - started) / 60,
                    "load": [load_before, os.getloadavg()[0]],
                    "machine": machine(args),
                    "rows": list(args.rows),
                    "new_tokens": args.new_tokens,
                    "repeats": args.repeats,
                    "kv_tokens": kv,
                    "max_rows": max_rows,
                    "threads": args.threads,
                },
                "prompt_tokens": [len(p) for p in ids["rows"][str(max(args.rows))]],
                "short_prompt_tokens": [len(p) for p in ids["short"]],
                "long_prompt_tokens": len(ids["long"]),
                "common_start": data["common_start"],
                "kv_numbers_per_position": data["kv_numbers_per_position"],
                "weights": data["weights"],
                "matmul_params": data["matmul_params"],
                "total_params": data["total_params"],
                "engines": measured,
            }
            # written after each model: an interrupted run keeps the models it finished
            RESULTS.mkdir(parents=True, exist_ok=True)
            text = report(figures)
            (RESULTS / "engine.md").write_text(text)
            path.write_text(json.dumps(figures, indent=1) + "\n")
            log(plot(figures))
    print(text)


def prepare_gguf(model: str, workdir: Path) -> str:
    """The packaged GGUF file's path (its parts joined into ``workdir`` where there are
    several), which names the packaged quantization."""
    from ponder.engines.models import PACKAGED_MODELS

    packaged = PACKAGED_MODELS[model]
    parts = packaged.locate()
    return str(parts[0]) if len(parts) == 1 else str(workdir / f"{model}.gguf")


#: the CPU flags the report names (what the kernels of the legs can use)
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")  # fmt: skip


def machine(args: argparse.Namespace) -> str:
    cpu, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                flags = [flag for flag in CPU_FLAGS if flag in present]
                break
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {platform.machine()} (flags: "
        f"{', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS)}), Python "
        f"{platform.python_version()}, {args.threads} thread(s); `uptime` at the end: "
        f"{uptime.strip()}"
    )


# --- report -------------------------------------------------------------------------------


def _rate(cell: dict[str, Any]) -> float:
    return float(cell["tokens"] / cell["seconds"])


def _row_rate(engine: dict[str, Any] | None, rows: int) -> float | None:
    """An engine's completion tokens/s at ``rows`` rows (None: not measured)."""
    if engine is None or "error" in engine:
        return None
    cell = engine.get("rows", {}).get(str(rows))
    return _rate(cell) if cell else None


def _old_rate(old: dict[str, Any], rows: int) -> float | None:
    if "rows" in old:
        cell = old["rows"].get(str(rows))
        return _rate(cell) if cell else None
    rate = old.get("rate", {}).get(str(rows))
    return float(rate) if rate else None


def _ok(engines: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in engines.items() if "error" not in v}


def one_core_limit(data: dict[str, Any]) -> float | None:
    """The tokens/s limit of one core in f32: sgemm GFLOP/s / (2 x the parameters a token
    is multiplied through)."""
    sgemm = _ok(data["engines"]).get("numpy sgemm")
    if sgemm is None:
        return None
    return float(sgemm["gflops"] * 1e9 / (2 * data["matmul_params"]))


@dataclass
class Goal:
    """One of the issue's goals, measured: ``value`` against ``limit``."""

    goal: str
    reference: str
    value: float | None
    limit: float | None  # None: reported, no bar
    above: bool = True
    kind: str = "rate"
    rows: int | None = None
    ref_label: str | None = None
    unit: str = " x"

    @property
    def met(self) -> bool | None:
        if self.value is None or self.limit is None:
            return None
        return self.value >= self.limit if self.above else self.value <= self.limit

    def cells(self) -> str:
        value = "-" if self.value is None else f"{self.value:.2f}{self.unit}"
        verdict = {
            None: "reported" if self.value is not None else "not measured",
            True: "met",
            False: "**not met**",
        }[self.met]
        return f"| {self.goal} | {self.reference} | {value} | {verdict} |"


def _references(
    model: str, candidates: dict[str, float], lowest: bool = False
) -> list[tuple[str, str]]:
    """(label, role) of the llama.cpp legs a goal compares with: the best of those that keep
    the answers, and the best of all where it is another (best: the highest figure, or the
    lowest with ``lowest``)."""
    if not candidates:
        return []

    def best(labels: list[str]) -> str:
        pick = min if lowest else max
        return pick(labels, key=lambda label: candidates[label])

    word = "smallest" if lowest else "fastest"
    keeping = [label for label in candidates if label in KEEPS_ANSWERS.get(model, {})]
    overall = best(list(candidates))
    if not keeping:
        return [(overall, f"the {word} llama.cpp leg (none measured keeps the answers)")]
    kept = best(keeping)
    if kept == overall:
        return [(kept, f"the {word} llama.cpp leg, and it keeps the answers")]
    return [
        (kept, f"the {word} llama.cpp leg that keeps the answers"),
        (overall, f"the {word} llama.cpp leg of all (its weights change the answers)"),
    ]


def goals_of(model: str, data: dict[str, Any]) -> list[Goal]:
    """The issue's goals for one model, where the figures to judge them were measured."""
    engines, run = _ok(data["engines"]), data["run"]
    ponder, bare = engines.get("ponder"), engines.get("openvino bare")
    llamas = {k: v for k, v in engines.items() if k.startswith("llama.cpp")}
    found: list[Goal] = []
    if ponder is None:
        return _service_goals(engines, bare)

    def llama_rates(rows: int) -> dict[str, float]:
        rates = {label: _row_rate(cell, rows) for label, cell in llamas.items()}
        return {label: rate for label, rate in rates.items() if rate}

    ponder_1 = _row_rate(ponder, 1)
    if ponder_1:
        for label, role in _references(model, llama_rates(1)):
            found.append(
                Goal(
                    f"1 row >= {GOAL_ONE_ROW} x llama.cpp's single sequence",
                    f"{label}: {role}",
                    ponder_1 / llama_rates(1)[label],
                    GOAL_ONE_ROW,
                    rows=1,
                    ref_label=label,
                )
            )
    for rows in (16, 32):
        rate = _row_rate(ponder, rows)
        if not rate:
            continue
        for label, role in _references(model, llama_rates(rows)):
            found.append(
                Goal(
                    f"{rows} rows >= {GOAL_BATCHED} x llama.cpp's batched decode",
                    f"{label}: {role}",
                    rate / llama_rates(rows)[label],
                    GOAL_BATCHED,
                    rows=rows,
                    ref_label=label,
                )
            )
        for label, limit in (("ct2 int8", GOAL_CT2), ("ct2 float32", None)):
            peer = _row_rate(engines.get(label), rows)
            if peer:
                what = (
                    f"{rows} rows >= {GOAL_CT2} x CTranslate2 int8"
                    if limit
                    else f"{rows} rows against CTranslate2 float32 (not a goal)"
                )
                role = "int8 weights and activations" if limit else "keeps the answers"
                found.append(
                    Goal(what, f"{label}: {role}", rate / peer, limit, rows=rows, ref_label=label)
                )
    limit = one_core_limit(data)
    most = max(run["rows"])
    rate = _row_rate(ponder, most)
    if limit and rate:
        found.append(
            Goal(
                f"fraction of the one-core f32 limit at {most} rows",
                f"numpy sgemm: {limit:.0f} tok/s",
                rate / limit,
                None,
                kind="limit",
                rows=most,
                unit="",
            )
        )
    sizes = {label: cell["peak_rss_gb"] for label, cell in llamas.items()}
    for label, role in _references(model, sizes, lowest=True):
        found.append(
            Goal(
                f"peak RSS <= {GOAL_RSS} x llama.cpp's (same rows and context)",
                f"{label}: {role}",
                ponder["peak_rss_gb"] / sizes[label],
                GOAL_RSS,
                above=False,
                kind="rss",
                ref_label=label,
            )
        )
    return found + _service_goals(engines, bare)


def _service_goals(engines: dict[str, Any], bare: dict[str, Any] | None) -> list[Goal]:
    """The goals measured through the service."""
    service = engines.get("service")
    if service is None:
        return []
    bare_16 = _row_rate(bare, 16)
    alone, beside = service["short_alone"], service["short_beside_essay"]
    return [
        Goal(
            f"service: 16 fast tasks >= {GOAL_SERVICE} x the bare pipeline",
            "openvino bare at 16 rows" + ("" if bare_16 else " (not measured in this run)"),
            _rate(service["burst"]) / bare_16 if bare_16 else None,
            GOAL_SERVICE,
            kind="burst",
            rows=16,
            ref_label="openvino bare",
        ),
        Goal(
            f"service: 16-token answer beside a 600-token essay <= {GOAL_BESIDE} x alone",
            "the same answer alone",
            beside["seconds"] / alone["seconds"],
            GOAL_BESIDE,
            above=False,
            kind="beside",
        ),
        Goal(
            f"service: /healthz p99 <= {GOAL_HEALTHZ_MS:g} ms while 32 rows decode",
            "-",
            service["healthz"]["p99_ms"],
            GOAL_HEALTHZ_MS,
            above=False,
            kind="healthz",
            unit=" ms",
        ),
    ]


def why_missed(model: str, data: dict[str, Any], goals: list[Goal]) -> list[str]:
    """A bullet for each goal missed, from this run's figures."""
    engines = _ok(data["engines"])
    ponder, bare = engines.get("ponder", {}), engines.get("openvino bare")
    limit = one_core_limit(data)
    bullets = []
    explained: set[str] = set()
    for goal in goals:
        if goal.met is not False:
            continue
        ref = engines.get(goal.ref_label or "", {})
        if goal.kind == "rate" and goal.rows is not None:
            rows = goal.rows
            p, r = _row_rate(ponder, rows), _row_rate(ref, rows)
            assert p and r
            text = (
                f"**{goal.goal}, against {goal.ref_label}**: ponder {p:.1f} tok/s, "
                f"{goal.ref_label} {r:.1f} ({p / r:.2f} x)."
            )
            b = _row_rate(bare, rows)
            if b:
                text += (
                    f" The bare pipeline on ponder's weights runs {b:.1f} tok/s "
                    f"({b / r:.2f} x {goal.ref_label}), ponder {p / b:.0%} of it: "
                )
                text += (
                    "the pipeline itself falls short on these weights, before ponder's "
                    "scheduling adds anything."
                    if b / r < (goal.limit or 0)
                    else "the pipeline alone would meet it; ponder's scheduling and the "
                    "round trips to its engine process cost the difference."
                )
                if p > 1.05 * b and goal.goal not in explained:
                    text += (
                        " (ponder above the bare pipeline, which runs the same model with "
                        "less around it, means the machine's load changed between the two "
                        "legs: these cells are as uncertain as that gap.)"
                    )
            explained.add(goal.goal)
            if rows == 1:
                text += (
                    f" One row reads every weight once per token: ponder's "
                    f"{data['weights']} file is {ponder['weights_gb']:.2f} GB, "
                    f"{goal.ref_label}'s {ref['weights_gb']:.2f} GB."
                )
            if limit and r > limit:
                text += (
                    f" {goal.ref_label} runs above the one-core f32 limit "
                    f"({limit:.0f} tok/s): its arithmetic is not f32."
                )
            changes = CHANGES_ANSWERS.get(model, {}).get(goal.ref_label or "")
            if changes:
                text += (
                    f" {goal.ref_label}'s weights change the answers "
                    f"(agreement with float32: {changes})."
                )
            bullets.append(text)
        elif goal.kind == "rss":
            text = (
                f"**{goal.goal}, against {goal.ref_label}**: ponder "
                f"{ponder['peak_rss_gb']:.2f} GB = its scheduler process "
                f"{ponder['parent_peak_rss_gb']:.2f} + the engine process "
                f"{ponder['engine_peak_rss_gb']:.2f}; {goal.ref_label} "
                f"{ref['peak_rss_gb']:.2f} GB (weights file {ref['weights_gb']:.2f} GB)"
            )
            if bare:
                text += f"; the bare pipeline's process {bare['peak_rss_gb']:.2f} GB"
            kv = data["run"]["kv_tokens"]
            numbers = data.get("kv_numbers_per_position", 0)
            engine_gb = ponder["engine_peak_rss_gb"]
            text += (
                f". Both hold {kv} KV positions: {numbers * 4 * kv / 1e9:.2f} GB in the "
                f"pipeline's f32 cache, {numbers * 2 * kv / 1e9:.2f} GB in llama.cpp's f16 one. "
                f"ponder's engine process: {ponder['engine_loaded_rss_gb']:.2f} GB once "
                f"started, {engine_gb:.2f} at its peak, of which its weights file is "
                f"{ponder['weights_gb']:.2f} GB and the KV cache "
                f"{numbers * 4 * kv / 1e9:.2f}: the remaining "
                f"{engine_gb - ponder['weights_gb'] - numbers * 4 * kv / 1e9:.2f} GB is the "
                "runtime's own (its libraries, the compiled model and its buffers). "
            )
            if engine_gb > GOAL_RSS * ref["peak_rss_gb"]:
                text += "The engine process alone is over the bar."
            else:
                text += (
                    "The engine process alone is within the bar; the scheduler process "
                    "(Python, ponder's modules, the tokenizer) takes it over."
                )
            bullets.append(text)
        elif goal.kind == "burst":
            service = engines["service"]["burst"]
            s, p, b = _rate(service), _row_rate(ponder, 16), _row_rate(bare, 16) or 0.0
            text = (
                f"**{goal.goal}**: the service {s:.1f} tok/s ({service['tasks']} tasks, "
                f"{service['tokens']} completion tokens in {service['seconds']:.1f} s), the "
                f"bare pipeline {b:.1f} at 16 rows"
            )
            if p and b:
                text += (
                    f", ponder's engine without the service {p:.1f} ({p / b:.0%} of "
                    f"the bare pipeline; the service {s / p:.0%} of the engine)"
                )
            text += (
                f". Prompt tokens per task: {service['prompt_tokens'] / service['tasks']:.0f} "
                f"through the service (the mode's messages), "
                f"{sum(data['prompt_tokens'][:16]) / 16:.0f} in the bench's rows."
            )
            bullets.append(text)
        elif goal.kind == "beside":
            service = engines["service"]
            alone, beside = service["short_alone"], service["short_beside_essay"]
            bullets.append(
                f"**{goal.goal}**: {beside['seconds']:.2f} s beside the essay against "
                f"{alone['seconds']:.2f} s alone ({alone['tokens']} and {beside['tokens']} "
                f"tokens); the essay produced {beside['essay_tokens']} tokens in "
                f"{beside['essay_seconds']:.1f} s and was "
                + ("still running" if beside["essay_running_after"] else "done")
                + " when the answer ended."
            )
        elif goal.kind == "healthz":
            h = engines["service"]["healthz"]
            bullets.append(
                f"**{goal.goal}**: p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms, max "
                f"{h['max_ms']:.1f} ms over {h['samples']} requests in {h['seconds']:.1f} s "
                f"({h['tokens']} tokens generated meanwhile)."
            )
    return bullets


def _answers(model: str, label: str, data: dict[str, Any]) -> str:
    if label in ("ponder", "openvino bare"):
        return (
            f"PONDER_ENGINE_WEIGHTS={data['weights']} (f16 keeps them, gguf changes them: "
            "engine-agreement-*.md)"
        )
    if label in KEEPS_ANSWERS.get(model, {}):
        return f"kept ({KEEPS_ANSWERS[model][label]})"
    if label in CHANGES_ANSWERS.get(model, {}):
        return f"changed ({CHANGES_ANSWERS[model][label]})"
    return "not measured"


def model_section(model: str, data: dict[str, Any], previous: dict[str, Any]) -> list[str]:
    run, engines = data["run"], data["engines"]
    ok = _ok(engines)
    rows_prompts, short = data["prompt_tokens"], data["short_prompt_tokens"]
    clean = data["common_start"] < BLOCK
    lines = [
        f"## {MODELS[model]}",
        "",
        f"Command: `{run['command']}` ({run['date']}), {run['minutes']:.1f} min; 1-minute "
        f"load average {run['load'][0]:.2f} at the start, {run['load'][1]:.2f} at the end. At "
        f"most {run['new_tokens']} new tokens per row; best of {run['repeats']} interleaved "
        f"rounds per cell. KV cache of ponder and the bare pipeline, and llama.cpp's "
        f"context at the largest rows: {run['kv_tokens']} positions; ponder's engine and the "
        f"bare pipeline take {run['max_rows']} rows.",
        "",
        f"Machine: {run['machine']}.",
        "",
        f"Prompts: {min(rows_prompts)}-{max(rows_prompts)} tokens at {max(run['rows'])} rows, "
        f"the 32 short ones {min(short)}-{max(short)}, the long one "
        f"{data['long_prompt_tokens']}. No two prompts share more than "
        f"{data['common_start']} leading tokens"
        + (
            " (under one 32-position block: no measurement reuses another's prefill)."
            if clean
            else " (**a whole block: the prefix cache may reuse a prefill**)."
        ),
    ]
    legs = [
        label
        for label, cell in engines.items()
        if label not in ("numpy sgemm", "service") or "error" in cell  # sections of their own
    ]
    if legs:
        lines += [
            "",
            "### Legs",
            "",
            "| leg | weights | weights file GB | greedy answers against float32 |",
            "|---|---|---:|---|",
        ]
    for label in legs:
        cell = engines[label]
        if "error" in cell:
            lines.append(f"| {label} | {cell['error']} | | |")
            continue
        lines.append(
            f"| {label} | {cell['weights']} | {cell['weights_gb']:.2f} "
            f"| {_answers(model, label, data)} |"
        )
    decoders = {label: cell for label, cell in ok.items() if "rows" in cell}
    if decoders:
        lines += [
            "",
            "### Throughput (completion tokens/s, prefill included) and peak RSS",
            "",
            "| engine | " + " | ".join(f"{r} rows" for r in run["rows"]) + " | peak RSS GB |",
            "|---|" + "---:|" * (len(run["rows"]) + 1),
        ]
    before = previous.get(model, {})
    before = before.get("engines", before)
    for label, cell in decoders.items():
        old = before.get(label, {})
        cells = []
        for rows in run["rows"]:
            measured = cell["rows"].get(str(rows))
            text = f"{_rate(measured):.1f}" if measured else "-"
            if measured and measured["tokens"] != rows * run["new_tokens"]:
                text += f" ({measured['tokens']} tok)"
            old_rate = _old_rate(old, rows)
            cells.append(text + (f" [{old_rate:.1f}]" if old_rate else ""))
        rss = f"{cell['peak_rss_gb']:.2f}"
        if "engine_peak_rss_gb" in cell:
            rss += f" ({cell['parent_peak_rss_gb']:.2f} + {cell['engine_peak_rss_gb']:.2f})"
        if old.get("rss_gb") or old.get("peak_rss_gb"):
            rss += f" [{old.get('rss_gb') or old.get('peak_rss_gb'):.2f}]"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {rss} |")
    if decoders:
        lines.append(
            f"\nIn brackets: {previous.get('source', 'the previous run')}. ponder's peak RSS "
            "is its worker process's plus its engine process's (in parentheses)."
        )
    ponder = ok.get("ponder")
    if ponder is not None:
        lines.append(
            f"ponder's worker: {ponder['import_rss_gb']:.2f} GB RSS at start, "
            f"{ponder['loaded_rss_gb']:.2f} GB with the engine started "
            f"({ponder['load_s']:.1f} s), its engine process {ponder['engine_loaded_rss_gb']:.2f}"
            " GB then; torch "
            + ("loaded" if ponder.get("torch_loaded", True) else "never imported")
            + "."
        )
    if decoders:
        lines += [
            "",
            "### Prefill (prompt tokens/s)",
            "",
            f"| engine | one long prompt ({data['long_prompt_tokens']} tokens) "
            "| 32 short prompts |",
            "|---|---:|---:|",
        ]
        for label, cell in decoders.items():
            lines.append(
                f"| {label} | {_rate(cell['prefill_long']):.0f} "
                f"| {_rate(cell['prefill_short']):.0f} |"
            )
        lines.append(
            "\nponder and the bare pipeline: each prompt asks for one new token (prefill and "
            "one step); the peers: one forward pass over the prompts."
        )
    if ponder is not None and "shared" in ponder:
        shared = ponder["shared"]
        one = shared["1"]["seconds"]
        lines += [
            "",
            "### Shared prefix (ponder)",
            "",
            f"N seeded samples (temperature 0.7) of one {data['long_prompt_tokens']}-token "
            f"prompt, submitted at once, {run['new_tokens']} new tokens at most; each N "
            "its own prompt (a tag at its start), so only the N samples can share a "
            "prefill, through the pipeline's prefix cache.",
            "",
            "| N | wall s | x one sample | tokens |",
            "|---:|---:|---:|---:|",
        ]
        for count in SAMPLES:
            cell = shared[str(count)]
            lines.append(
                f"| {count} | {cell['seconds']:.2f} | {cell['seconds'] / one:.2f} "
                f"| {cell['tokens']} |"
            )
    limit = one_core_limit(data)
    if limit is not None:
        sgemm, most = ok["numpy sgemm"], max(run["rows"])
        params = data["matmul_params"]
        lines += [
            "",
            "### The one-core f32 limit",
            "",
            f"numpy sgemm: {sgemm['gflops']:.1f} GFLOP/s ({sgemm['n']} x {sgemm['n']} "
            f"float32, one BLAS thread; CPU time / wall {sgemm['cpu_per_wall']:.2f}). A "
            f"token is multiplied through P = {params / 1e6:.1f} M parameters (of "
            f"{data['total_params'] / 1e6:.1f} M: the blocks' linear layers and the output "
            "projection; not the embedding lookup, nor attention over the context), "
            f"2P = {2 * params / 1e9:.3f} GFLOP, so limit = GFLOP/s / 2P = "
            f"**{limit:.0f} tok/s**. Quantized weights with int8 arithmetic are not bound "
            "by it.",
            "",
            f"| engine | tok/s at {most} rows | fraction of the limit |",
            "|---|---:|---:|",
        ]
        for label, cell in ok.items():
            rate = _row_rate(cell, most)
            if rate:
                lines.append(f"| {label} | {rate:.1f} | {rate / limit:.2f} |")
    service = ok.get("service")
    if service is not None:
        burst, alone = service["burst"], service["short_alone"]
        beside, health = service["short_beside_essay"], service["healthz"]
        bare_16 = _row_rate(ok.get("openvino bare"), 16)
        lines += [
            "",
            "### Through the service (`ponder serve`)",
            "",
            "`ponder serve` on the openvino engine (`PONDER_ENGINE_THREADS` "
            f"{run.get('threads', 1)}, "
            "`PONDER_ENGINE_MAX_ROWS=32`, the embedded store; bench/engine_service.py), "
            f"ready in {service['ready_s']:.1f} s; peak RSS {service['peak_rss_gb']:.2f} "
            f"GB ({service['serve_peak_rss_gb']:.2f} + engine process "
            f"{service['engine_peak_rss_gb']:.2f}).",
            "",
            "| measure | figure |",
            "|---|---:|",
            f"| 16 concurrent fast tasks, {burst.get('max_new_tokens', 64)} tokens at most: "
            f"completion tokens/s (first submit to last result) | {_rate(burst):.1f} |",
            (
                f"| ... against the bare pipeline at 16 rows ({bare_16:.1f} tok/s) | "
                f"{_rate(burst) / bare_16:.2f} x |"
                if bare_16
                else "| ... against the bare pipeline at 16 rows | not measured |"
            ),
            f"| ... prompt tokens per task | {burst['prompt_tokens'] / burst['tasks']:.0f} |",
            f"| 16-token answer alone: submit to done, s | {alone['seconds']:.2f} |",
            f"| ... sent 2 s after a 600-token essay started, s | {beside['seconds']:.2f} |",
            f"| ... ratio | {beside['seconds'] / alone['seconds']:.2f} x |",
            f"| ... the essay's tokens; still running when the answer ended | "
            f"{beside['essay_tokens']}; "
            + ("yes" if beside["essay_running_after"] else "no")
            + " |",
            f"| /healthz every 20 ms while 32 tasks of 128 tokens run: p50 / p99 / max ms "
            f"| {health['p50_ms']:.1f} / {health['p99_ms']:.1f} / {health['max_ms']:.1f} |",
            f"| ... requests; the 32 tasks' wall s; their completion tokens/s | "
            f"{health['samples']}; {health['seconds']:.1f}; {_rate(health):.1f} |",
        ]
    goals = goals_of(model, data)
    if goals:
        lines += [
            "",
            "### Goals (issue 24; ratios in this run)",
            "",
            "Each engine on the weights that keep its answers is what the goals compare: "
            "the llama.cpp reference of each goal is the best leg that keeps the answers "
            "(short-answer and quality agreement with float32, from the agreement "
            "reports); the best leg of all is shown beside it where it is another.",
            "",
            "| goal | against | measured | verdict |",
            "|---|---|---:|---|",
        ]
        lines += [goal.cells() for goal in goals]
        bullets = why_missed(model, data, goals)
        lines += ["", "### Where a goal is missed, and why", ""]
        lines += [f"- {b}" for b in bullets] or ["No goal measured here is missed."]
    lines.append("")
    return lines


def report(figures: dict[str, Any]) -> str:
    previous = figures["previous"]
    lines = [
        "# Engine benchmark: ponder's engine against the bare pipeline, llama.cpp and CTranslate2",
        "",
        "Greedy, a distinct prompt per row, the same token ids for every engine; each cell "
        "the best of the run's repeats. Completion tokens/s include prefill. Legs: see the "
        "docstring of bench/engine.py. Each model's figures come from one run, stated in its "
        "section.",
        "",
    ]
    for model in MODELS:
        if figures.get(model):
            lines += model_section(model, figures[model], previous)
    return "\n".join(lines)


def plot(figures: dict[str, Any]) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    models = [m for m in MODELS if m in figures]
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        run = figures[model]["run"]
        for label, cell in figures[model]["engines"].items():
            if "rows" not in cell:
                continue
            rows = [r for r in run["rows"] if str(r) in cell["rows"]]
            rates = [_rate(cell["rows"][str(r)]) for r in rows]
            style = "-" if label in ("ponder", "openvino bare") else "--"
            ax.plot(rows, rates, style, marker="o", label=label)
        limit = one_core_limit(figures[model])
        if limit:
            ax.axhline(limit, color="grey", linewidth=0.8, linestyle=":",
                       label="one-core f32 limit")  # fmt: skip
        ax.set(xscale="log", xlabel="rows at once", ylabel="completion tokens/s",
               title=MODELS[model])  # fmt: skip
        ax.set_xticks(list(run["rows"]), [str(r) for r in run["rows"]])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(RESULTS / "engine.png", dpi=110)
    return f"plot: {RESULTS / 'engine.png'}"


@dataclass(frozen=True)
class _Problem:
    """One problem of ``--agreement``: what to ask, and how to read and score the answer."""

    #: SampleRequest fields: ``prompt`` or ``messages``
    ask: dict[str, Any]
    task_type: str
    question: str
    correct: Callable[[str | None], bool]


def agreement_problems(args: argparse.Namespace) -> tuple[list[_Problem], str]:
    """``--style``'s problems and the report's sentence about them."""
    if args.style == "quality":
        sys.path.insert(0, str(ROOT / "bench"))
        from ponder.admission import build_task
        from ponder.config import load_settings
        from ponder.enhance.strategy import create_strategy
        from ponder.schemas import TaskCreate
        from quality_collect import DATASETS, SEED, Scorer

        settings = load_settings()
        size = max(1, args.problems // len(DATASETS))
        scorer = Scorer(DATASETS, size, SEED)
        problems = []
        for i, p in enumerate(scorer.problems()):
            request = TaskCreate(prompt=p.question, mode="standard", task_type=p.task_type)
            strategy = create_strategy(
                build_task(request, settings, task_id=f"agreement-{i}", owner="bench"), settings
            )
            problems.append(
                _Problem(
                    {"messages": strategy.messages(strategy.plan()[0])},
                    p.task_type,
                    p.question,
                    lambda answer, p=p: scorer.score(p.dataset, p.index, answer) == 1.0,
                )
            )
        return problems, (
            f"{len(problems)} problems of the quality benchmark ({size} of each of "
            f"{', '.join(DATASETS)}, seed {SEED}), each asked as a standard task asks its "
            "greedy sample 0 (the strategy's instruction, then the question); answers "
            "extracted and scored as the quality benchmark does"
        )
    import reasoning_gym

    half = args.problems // 2
    second, ask = {
        "short": ("chain_sum", "Reply with the number only."),
        "reasoning": (
            "gsm_symbolic",
            "Solve it step by step, then give the final answer on its own line as "
            "'Answer: <number>'.",
        ),
    }[args.style]
    problems = []
    for name, size in (("basic_arithmetic", half), (second, args.problems - half)):
        dataset = reasoning_gym.create_dataset(name, size=size, seed=11)
        for entry in dataset:
            problems.append(
                _Problem(
                    {"prompt": f"{entry['question']}\n{ask}"},
                    "math",
                    entry["question"],
                    lambda answer, d=dataset, e=entry: (
                        answer is not None and d.score_answer(answer, e) == 1.0
                    ),
                )
            )
    return problems, (
        f"{len(problems)} problems: {half} reasoning-gym basic_arithmetic and "
        f'{len(problems) - half} {second} (seed 11), each followed by "{ask}"; answers '
        "extracted by ponder (math)"
    )


def _extract(problem: _Problem, text: str) -> str | None:
    """The answer ponder extracts from ``text`` for ``problem`` (None: none)."""
    from ponder.enhance.answers import answer_type

    kind = answer_type(problem.task_type)
    return kind.extract(text, kind.question(problem.question)) if text else None


def ct2_texts(
    model: str, asks: list[dict[str, Any]], new_tokens: int, compute_type: str, args: Any
) -> list[str]:
    """CTranslate2's greedy texts for ``asks`` in ``compute_type``, templated as ponder
    templates them."""
    from ponder.config import load_settings
    from ponder.engines.base import SampleRequest
    from ponder.engines.models import checkpoint_dir, load_tokenizer
    from ponder.engines.textrows import encode_prompt

    settings = load_settings(model=model)
    checkpoint = checkpoint_dir(model, settings.model_cache_dir)
    tokenizer, eos_ids = load_tokenizer(checkpoint, light=True)
    job = {
        "worker": "ct2-answers",
        "checkpoint": str(checkpoint),
        "threads": args.threads,
        "eos_ids": sorted(eos_ids),
        "compute_type": compute_type,
        "new_tokens": new_tokens,
        "prompts": [encode_prompt(tokenizer, SampleRequest(**ask)) for ask in asks],
    }
    with tempfile.TemporaryDirectory() as tmp:
        result = run_worker(PEERS_PYTHON, {**job, "workdir": args.workdir or tmp}, args.timeout_s)
    if "error" in result:
        raise RuntimeError(f"ct2 {compute_type}: {result['error']}")
    texts: list[str] = result["texts"]
    return texts


def run_agreement(args: argparse.Namespace) -> None:
    """Greedy answers of each runner and weights against the transformers model's.

    ``--problems`` problems, each model's greedy output through the engine (``hf``:
    float32, the reference; the openvino engine on f16 and on the file's own quantized
    weights, ``gguf``; where ``make peers`` ran, CTranslate2 int8,
    the throughput peer, and float32, its control, on the same templated prompt ids),
    answers extracted by ponder: the rate at
    which each agrees with the reference, and each one's accuracy under the dataset's own
    scorer. ``--style short``: half reasoning-gym ``basic_arithmetic``, half
    ``chain_sum``, the number alone asked for; ``--style reasoning``: half
    ``basic_arithmetic``, half ``gsm_symbolic``, step by step; ``--style quality``: the
    quality benchmark's problems as its greedy sample asks them, at its token limits
    (``bench/quality.py``'s ``MAX_NEW_TOKENS``): its greedy accuracy per runner.
    """
    from ponder.config import load_settings
    from ponder.engines import create_engine
    from ponder.engines.base import BaseEngine, SampleRequest
    from ponder.enhance.answers import same_answer

    # the first leg is the reference: the transformers model in float32
    legs: dict[str, dict[str, str]] = {
        "hf float32": {"engine": "transformers"},
        "openvino f16": {"engine": "openvino", "engine_weights": "f16"},
        "openvino gguf": {"engine": "openvino", "engine_weights": "gguf"},
    }
    if PEERS_PYTHON.is_file():
        # CTranslate2 (the throughput peer) in the peers' venv; float32: the control
        legs["ct2 int8"] = {"compute_type": "int8"}
        legs["ct2 float32"] = {"compute_type": "float32"}
    if args.legs:
        legs = {k: v for k, v in legs.items() if k == "hf float32" or k in args.legs}
    problems, described = agreement_problems(args)
    if args.style == "quality":
        from quality import MAX_NEW_TOKENS

        tokens = {m: MAX_NEW_TOKENS.get(m, 256) for m in args.models}
    else:
        tokens = {m: args.new_tokens for m in args.models}
    n = len(problems)
    lines = [f"## {args.style} answers", "",
             f"Command: `{shlex.join(['.venv/bin/python', 'bench/engine.py', *sys.argv[1:]])}"
             f"` ({dt.date.today().isoformat()}, 1-minute load average "
             f"{os.getloadavg()[0]:.2f} at the start).", "",
             f"{described}; greedy, at most "
             + ", ".join(f"{tokens[m]} new tokens ({m})" for m in args.models) + ".", "",
             "| model | " + " | ".join(f"{leg} agreeing" for leg in list(legs)[1:])
             + " | accuracy: " + " | ".join(legs) + " |",
             "|---|" + "---:|" * (2 * len(legs) - 1)]  # fmt: skip
    for model in args.models:
        answers: dict[str, list[str | None]] = {}
        for leg, overrides in legs.items():
            if leg.startswith("ct2 "):
                asks = [p.ask for p in problems]
                outputs = ct2_texts(model, asks, tokens[model], overrides["compute_type"], args)
                found = [_extract(p, text) for p, text in zip(problems, outputs, strict=True)]
                answers[leg] = found
                log(f"{model} {leg}: done")
                continue
            settings = load_settings(model=model, engine_threads=args.threads,
                                     engine_max_rows=16, **overrides)  # fmt: skip
            engine = create_engine(settings)
            loop = asyncio.new_event_loop()
            requests = [SampleRequest(**p.ask, max_new_tokens=tokens[model]) for p in problems]

            async def answer_all(
                e: BaseEngine = engine, rs: list[SampleRequest] = requests
            ) -> list[Any]:
                return await asyncio.gather(*(e.submit(r) for r in rs))

            outputs = loop.run_until_complete(answer_all())
            loop.run_until_complete(engine.close())
            loop.close()
            answers[leg] = [_extract(p, o.text) for p, o in zip(problems, outputs, strict=True)]
            log(f"{model} {leg}: done")

        def agreeing(found: list[str | None], reference: list[str | None]) -> str:
            same = sum(
                a == b or (a is not None and b is not None and same_answer(a, b, p.task_type))
                for a, b, p in zip(found, reference, problems, strict=True)
            )
            return f"{same}/{n} = {same / n:.0%}"

        def accuracy(found: list[str | None]) -> str:
            right = sum(p.correct(a) for a, p in zip(found, problems, strict=True))
            return f"{right}/{n} = {right / n:.1%}"

        reference = answers["hf float32"]
        lines.append(
            f"| {MODELS[model]} | "
            + " | ".join(agreeing(answers[leg], reference) for leg in list(legs)[1:])
            + " | "
            + " | ".join(accuracy(answers[leg]) for leg in legs)
            + " |"
        )
        log(lines[-1])
    lines += ["", f"Machine: {machine(args)}.", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, text = RESULTS / f"engine-agreement-{args.style}.md", "\n".join(lines)
    if args.merge and path.is_file():  # this run's models beside the earlier runs'
        text = path.read_text().rstrip("\n") + "\n\n" + text.split("\n", 2)[2]
    path.write_text(text)
    print(text)


def main() -> None:
    global RESULTS
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of every engine, interleaved (best cell kept)"
    )
    parser.add_argument("--threads", type=int, default=1, help="threads of every engine")
    parser.add_argument(
        "--only",
        nargs="+",
        help="these legs only (labels: ponder, 'openvino bare', 'llama.cpp Q8_0', 'ct2 int8', "
        "'numpy sgemm', service, ...; a trailing * matches a prefix)",
    )
    parser.add_argument("--workdir", help="keep converted peer models here between runs")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per engine and model")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other models' figures of engine.json (each model is one run); "
        "--agreement: add this run's section to the report",
    )
    parser.add_argument(
        "--agreement",
        action="store_true",
        help="check what each engine's weights change in the greedy answers instead "
        "(see run_agreement)",
    )
    parser.add_argument("--problems", type=int, default=50, help="--agreement: problems")
    parser.add_argument("--legs", nargs="+", help="--agreement: these legs only (and hf float32)")
    parser.add_argument("--style", choices=("short", "reasoning", "quality"), default="short",
                        help="--agreement: the kind of problems (see run_agreement)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="where reports go")
    args = parser.parse_args()
    RESULTS = args.results
    if args.worker:
        job = json.loads(sys.stdin.read())
        print(json.dumps(WORKERS[args.worker](job)))
    elif args.agreement:
        run_agreement(args)
    else:
        main_run(args)


if __name__ == "__main__":
    main()
