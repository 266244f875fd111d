"""Benchmark: time to first answer for a burst of auto tasks, beside the same burst in
standard mode.

``make bench-auto-burst`` (or ``python bench/auto_burst.py``) starts ``ponder serve`` on the
scripted engine (a modelled step latency, ``PONDER_SCRIPTED_STEP_MS``, and a batch of
``--rows`` rows, so that rows queue for the engine as on a model) and sends bursts of
``--tasks`` tasks in two waves (the second ``--gap`` seconds after the first: newer tasks
that arrive while the first wave's auto tasks escalate), auto and standard in turn,
``--rounds`` times each. Each task is followed over SSE: its time to first answer is
submit → its first ``preliminary`` or ``result`` event. Half the tasks' samples agree,
half disagree; auto runs at its default target, standard at its default samples.

The question it answers: auto's escalation rows (stages 2 and 3) run one priority level
below the task's, so they must not hold back the first answers of newer tasks. Writes
``bench/results/auto-burst.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RESULTS, free_port, load_avg, percentile, wait_ready
from ponder.client import AsyncClient

REPORT = RESULTS / "auto-burst.md"
PROMPTS = (
    "What is 6 * 7? [[answers: 42, 42, 42, 42, 42]] [[tokens: 40]]",
    "What is 6 * 7? [[answers: 42, 17, 9, 42, 42]] [[tokens: 40]]",
)


def serve(port: int, workdir: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PONDER_ENGINE": "scripted",
        "PONDER_SCRIPTED_STEP_MS": args.step_ms,
        "PONDER_ENGINE_MAX_ROWS": str(args.rows),
        "PONDER_REDIS_URL": "",
        "PONDER_SQLITE_PATH": str(workdir / "burst.db"),
        "PONDER_PORT": str(port),
    }
    log = (workdir / "serve.log").open("wb")
    ponder = Path(sys.executable).with_name("ponder")
    return subprocess.Popen([str(ponder), "serve"], env=env, stdout=log, stderr=log)


async def first_answer(client: AsyncClient, prompt: str, mode: str) -> dict[str, Any]:
    started = time.monotonic()
    task = await client.submit(prompt, mode=mode, task_type="math")
    first: float | None = None
    async for event in client.events(task.id, deltas=False, timeout=600):
        if first is None and event.event in ("preliminary", "result"):
            first = time.monotonic() - started
    ended = await client.get(task.id)
    return {
        "first_s": first if first is not None else time.monotonic() - started,
        "end_s": time.monotonic() - started,
        "samples": ended.samples_used,
        "stage": ended.result.stage if ended.result else None,
    }


async def burst(client: AsyncClient, mode: str, tasks: int, gap_s: float) -> list[dict[str, Any]]:
    """Two waves of ``tasks / 2``; each result says its wave."""
    half = tasks // 2

    async def wave(n: int, label: int) -> list[dict[str, Any]]:
        rows = await asyncio.gather(*(first_answer(client, PROMPTS[i % 2], mode) for i in range(n)))
        return [{**r, "wave": label} for r in rows]

    first = asyncio.create_task(wave(half, 1))
    # the second wave arrives gap_s later, while the first runs (at once if it has ended)
    await asyncio.wait({first}, timeout=gap_s)
    second = await wave(tasks - half, 2)
    return [*await first, *second]


def describe(rows: list[dict[str, Any]]) -> str:
    firsts = [r["first_s"] for r in rows]
    return f"{percentile(firsts, 50):.2f} | {percentile(firsts, 99):.2f}"


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ponder-auto-burst-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(port, workdir, args)
    results: dict[str, list[dict[str, Any]]] = {"auto": [], "standard": []}
    try:
        await wait_ready(url, workers=1, timeout_s=120)
        load = load_avg()
        async with AsyncClient(url, timeout=600) as client:
            for r in range(args.rounds):
                for mode in ("auto", "standard") if r % 2 == 0 else ("standard", "auto"):
                    rows = await burst(client, mode, args.tasks, args.gap)
                    results[mode] += rows
                    print(f"round {r + 1} {mode}: {describe(rows)}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    lines = [
        "# Time to first answer: a burst of auto tasks beside the same burst in standard",
        "",
        f"Command: `.venv/bin/python bench/auto_burst.py --tasks {args.tasks} --rounds "
        f"{args.rounds} --gap {args.gap} --rows {args.rows} --step-ms {args.step_ms}`; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `uptime` at the start: "
        f"{load}. `ponder serve` on the scripted engine (step {args.step_ms} ms: base, per "
        f"row; {args.rows} rows at once), embedded store. Each round sends {args.tasks} "
        f"tasks in two waves {args.gap} s apart, auto and standard in turn; half the tasks' "
        "samples agree, half disagree.",
        "",
        "| mode | tasks | first answer p50 (s) | p99 (s) | wave 2 (newer tasks) p50 | p99 "
        "| whole task p50 (s) | mean samples |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, rows in results.items():
        newer = [r for r in rows if r["wave"] == 2]
        ends = [r["end_s"] for r in rows]
        lines.append(
            f"| {mode} | {len(rows)} | {describe(rows)} | {describe(newer)} | "
            f"{percentile(ends, 50):.2f} | {sum(r['samples'] for r in rows) / len(rows):.2f} |"
        )
    auto = [r["first_s"] for r in results["auto"]]
    std = [r["first_s"] for r in results["standard"]]
    stages = {s: sum(r["stage"] == s for r in results["auto"]) for s in (1, 2, 3)}
    lines += [
        "",
        f"Auto tasks ended in stage 1: {stages[1]}, stage 2: {stages[2]}, stage 3: "
        f"{stages[3]}. Time to first answer, auto against standard: p50 "
        f"{percentile(auto, 50) / percentile(std, 50):.2f}x, "
        f"p99 {percentile(auto, 99) / percentile(std, 99):.2f}x.",
        "",
    ]
    text = "\n".join(lines)
    REPORT.write_text(text)
    print(text, flush=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between the waves")
    parser.add_argument("--rows", type=int, default=16, help="the engine's batch")
    parser.add_argument("--step-ms", default="20,1", help="the scripted step: base,per_row")
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
