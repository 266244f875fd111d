"""Two local models behind one ``ponder serve`` (issue #45): resident memory of each model
alone and of both, the first task of an unloaded model against its load time, and the
memory given back when a model unloads.

One ``ponder serve`` process (embedded SQLite, no Redis) with a models file of two
openvino models, SmolLM2-135M (``smollm2-135m``) and Qwen2.5-0.5B (``qwen0.5b``), one
engine thread each, both loaded on demand (``keep_alive_s`` short, so that each unloads
between the phases). Memory is the resident set of the service's process tree (the
``ponder serve`` process and its engine processes), read with psutil; a model's own figure
is what the console reports for it (its engine process's VmRSS).

1. each model alone: a first task (the model unloaded: it loads), a second (loaded), the
   tree's memory then, and after it unloads;
2. both: a task to each at once, the tree's memory with both loaded.

A model's load time is the service's own log line (``model NAME loaded (openvino, S s)``);
the models' cache entries are written before the run (a first start converts the weights).

    .venv/bin/python bench/models.py            # writes bench/results/models.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness import (
    Proc,
    code_version,
    environment,
    free_port,
    load_avg,
    wait_ready,
    write_report,
)

MODELS = {"smollm2": "smollm2-135m", "qwen": "qwen0.5b"}
PROMPT = "What is 17 + 25? Answer with the number."


def models_file(path: Path, keep_alive_s: float) -> Path:
    path.write_text(
        "".join(
            f'[models.{name}]\nengine = "openvino"\nmodel = "{model}"\nthreads = 1\n'
            f"keep_alive_s = {keep_alive_s}\n\n"
            for name, model in MODELS.items()
        )
    )
    return path


def tree_mb(pid: int) -> float:
    """Resident memory of the process and its descendants, MiB."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


def parent_mb(pid: int) -> float:
    """Resident memory of the ``ponder serve`` process itself, MiB."""
    return float(psutil.Process(pid).memory_info().rss) / 2**20


async def run_task(c: httpx.AsyncClient, model: str, max_new_tokens: int) -> float:
    """Seconds from the submit to the task's end (its event stream followed, no polling)."""
    t0 = time.monotonic()
    body = {"prompt": PROMPT, "model": model, "mode": "fast", "max_new_tokens": max_new_tokens}
    r = await c.post("/v1/tasks", json=body)
    r.raise_for_status()
    task_id = r.json()["id"]
    async with c.stream("GET", f"/v1/tasks/{task_id}/events") as stream:
        async for _ in stream.aiter_lines():
            pass
    elapsed = time.monotonic() - t0
    task = (await c.get(f"/v1/tasks/{task_id}")).json()
    if task["status"] != "done":
        raise RuntimeError(f"task on {model} ended {task['status']}: {task.get('error')}")
    return elapsed


async def model_states(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    body = (await c.get("/v1/overview")).json()
    return {m["model"]: m for m in body["models"]}


async def engines_gone(pid: int, timeout_s: float) -> None:
    """Until the engine processes under ``pid`` (``ponder serve``) have exited: the model's
    unload, waited on with the OS's process exits (psutil.wait_procs, in a thread)."""
    engines = [
        p
        for p in psutil.Process(pid).children(recursive=True)
        if any("openvino_process" in part for part in p.cmdline())
    ]
    _, alive = await asyncio.to_thread(psutil.wait_procs, engines, timeout=timeout_s)
    if alive:
        raise RuntimeError(f"engine processes {[p.pid for p in alive]} alive after {timeout_s} s")


def load_seconds(log: str, model: str) -> list[float]:
    return [float(s) for s in re.findall(rf"model {model} loaded \(openvino, ([0-9.]+) s\)", log)]


def prepare() -> None:
    """Write each model's cache entry first (a first start converts the weights: tens of
    seconds that are not a load)."""
    from ponder.config import load_settings
    from ponder.engines.models import engine_files

    settings = load_settings()
    for model in MODELS.values():
        engine_files(model, settings.model_cache_dir, settings.engine_weights)


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PONDER_")},
        "PONDER_MODELS_FILE": str(models_file(workdir / "models.toml", args.keep_alive_s)),
        "PONDER_SQLITE_PATH": str(workdir / "ponder.db"),
        "PONDER_MAX_LOADED_MODELS": "2",
        "PONDER_LOG_LEVEL": "INFO",
        "PONDER_API_KEYS": "",
    }
    argv = [sys.executable, "-m", "ponder.cli", "serve", "--host", "127.0.0.1"]
    serve = await Proc("serve", [*argv, "--port", str(port)], env, workdir).start()
    out: dict[str, Any] = {"alone": {}}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            try:
                await wait_ready(f"http://127.0.0.1:{port}", workers=1, timeout_s=120)
            except RuntimeError as e:
                raise RuntimeError(f"ponder serve did not start:\n{serve.log_tail()}") from e
            out["base_mb"] = tree_mb(serve.pid)
            for name in MODELS:
                first = await run_task(c, name, args.tokens)
                warm = await run_task(c, name, args.tokens)
                loaded_mb, loaded_parent = tree_mb(serve.pid), parent_mb(serve.pid)
                engine_mb = (await model_states(c))[name]["resident_mb"]
                await engines_gone(serve.pid, args.keep_alive_s + 60)
                out["alone"][name] = {
                    "first_s": first,
                    "warm_s": warm,
                    "load_s": load_seconds(serve.log_tail(10**6), name)[-1],
                    "tree_mb": loaded_mb,
                    "parent_mb": loaded_parent,
                    "engine_mb": engine_mb,
                    "after_mb": tree_mb(serve.pid),
                    "parent_after_mb": parent_mb(serve.pid),
                }
            for _ in range(3):  # until both are loaded at once (a keep-alive may end first)
                both = await asyncio.gather(*(run_task(c, n, args.tokens) for n in MODELS))
                states = await model_states(c)
                if all(states[name]["state"] == "loaded" for name in MODELS):
                    break
            out["both"] = {
                "task_s": dict(zip(MODELS, both, strict=True)),
                "tree_mb": tree_mb(serve.pid),
                "parent_mb": parent_mb(serve.pid),
                "engine_mb": {name: states[name]["resident_mb"] for name in MODELS},
                "states": {name: states[name]["state"] for name in MODELS},
            }
    finally:
        await serve.stop(timeout_s=30)
    return out


def report(args: argparse.Namespace, r: dict[str, Any], started: str, load: str) -> str:
    base = r["base_mb"]
    lines = [
        "# Two models behind one ponder serve",
        "",
        f"`.venv/bin/python bench/models.py --tokens {args.tokens} --keep-alive-s "
        f"{args.keep_alive_s:g}` at commit {code_version()}, started {started}. "
        f"{environment()}. Load (`uptime` at the start): `{load}`.",
        "",
        "One `ponder serve` (SQLite) with a models file of two openvino models, one engine "
        "thread each, loaded on demand; each task one sample (`fast`) of at most "
        f"{args.tokens} tokens. Memory: the resident set of the service's process tree "
        "(psutil); engine: the model's engine process as the console reports it.",
        "",
        f"Service alone (nothing loaded): **{base:.0f} MiB**.",
        "",
        "| model | load (its log) | first task, unloaded | second task | first - load |"
        " tree loaded | engine process | serve process | model's share | tree after unload"
        " | serve process after | given back |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    share_sum = 0.0
    for name, a in r["alone"].items():
        share = a["tree_mb"] - base
        share_sum += share
        back = (a["tree_mb"] - a["after_mb"]) / share if share > 0 else float("nan")
        lines.append(
            f"| {name} ({MODELS[name]}) | {a['load_s']:.1f} s | {a['first_s']:.2f} s | "
            f"{a['warm_s']:.2f} s | {a['first_s'] - a['load_s']:+.2f} s | "
            f"{a['tree_mb']:.0f} MiB | {a['engine_mb']:.0f} MiB | {a['parent_mb']:.0f} MiB | "
            f"{share:.0f} MiB | {a['after_mb']:.0f} MiB | {a['parent_after_mb']:.0f} MiB | "
            f"{back:.0%} |"
        )
    b = r["both"]
    both_share = b["tree_mb"] - base
    tasks = ", ".join(f"{k} {v:.2f} s" for k, v in b["task_s"].items())
    lines += [
        "",
        f"Both loaded (a task to each at once: {tasks}; "
        f"states {b['states']}): tree **{b['tree_mb']:.0f} MiB** (serve process "
        f"{b['parent_mb']:.0f} MiB), engine processes "
        + ", ".join(f"{k} {v:.0f} MiB" for k, v in b["engine_mb"].items() if v is not None)
        + f"; the models' share {both_share:.0f} MiB against {share_sum:.0f} MiB for each "
        f"alone summed (**{both_share / share_sum:.2f}x**; goal ≤ 1.10x).",
        "",
        "What stays after an unload is the serve process's own growth while the model was "
        "loaded (its tokenizer copies, freed but kept by Python's and glibc's heaps: "
        + ", ".join(
            f"{a['parent_after_mb']:.0f} MiB after {name}" for name, a in r["alone"].items()
        )
        + f", from {base:.0f} MiB); each engine process's memory goes back whole (the "
        "process ends). First - load: what a first task costs beyond its model's load: "
        "the task itself (the second task's time) and the hand-over; goal ≤ 2 s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16, help="max_new_tokens of each task")
    p.add_argument("--keep-alive-s", type=float, default=20.0, help="each model's keep_alive_s")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "models.md")
    args = p.parse_args()
    prepare()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = load_avg()
    with tempfile.TemporaryDirectory(prefix="ponder-models-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    text = report(args, result, started, load)
    write_report(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
